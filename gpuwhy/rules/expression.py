"""Parse one expression of the rules DSL on its own, outside a rule (``gpuwhy check``).

The same grammar, transformer and name checks as rule files (parser.py): only the start
symbol differs. ``rewrite`` sees the raw tree before names are resolved, so a caller can
map its own shorthand onto the vocabulary (``sm_active`` -> ``gpu.sm_active``) or give
windowless aggregates a window.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import cast

import lark
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

from gpuwhy.rules import model as m
from gpuwhy.rules.parser import (
    GRAMMAR,
    MAX_REGEX_CHARS,
    RuleSyntaxError,
    _accepted,
    _Checker,
    _expected,
    _ToModel,
    check_tree,
    problems_reported,
)

MAX_EXPRESSION_CHARS = 4096


@cache
def _expression_parser() -> lark.Lark:
    return lark.Lark(GRAMMAR, parser="lalr", propagate_positions=True,
                     maybe_placeholders=False, start="expr")


def parse_expression(text: str, *, scope: str = "process",
                     rewrite: Callable[[m.Node], m.Node] | None = None,
                     path: str = "<expression>") -> m.Node:
    """The checked expression tree of ``text``; raises :class:`RuleSyntaxError` only."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise RuleSyntaxError(path, 1, 1, f"expression longer than {MAX_EXPRESSION_CHARS} "
                                          "characters")
    try:
        tree = _expression_parser().parse(text)
    except UnexpectedEOF as exc:
        raise RuleSyntaxError(path, 1, len(text.rstrip()) + 1, "unexpected end of expression; "
                              "expected "
                              + _expected(_accepted(exc, exc.expected))) from None
    except UnexpectedCharacters as exc:
        pos = cast(int, exc.pos_in_stream)       # set on every lexer error
        char = text[pos] if pos < len(text) else ""
        raise RuleSyntaxError(path, exc.line, exc.column,
                              f"unexpected character {char!r}") from None
    except UnexpectedInput as exc:
        unexpected = cast(UnexpectedToken, exc)     # the one left: EOF, characters are above
        token = unexpected.token
        at_end = token.type == "$END"
        what = "end of expression" if at_end else f"{str(token)!r}"
        column = len(text.rstrip()) + 1 if at_end else max(exc.column, 1)
        raise RuleSyntaxError(path, max(exc.line, 1), column,
                              f"unexpected {what}; expected "
                              + _expected(_accepted(exc, unexpected.expected))) from None
    except RecursionError:
        raise RuleSyntaxError(path, 1, 1, "expression nested too deeply") from None
    rule = m.Rule(id="expression", path=path, line=1, text=text, scope=scope)
    with problems_reported(path, "expression"):
        check_tree(tree)
        node = _ToModel().transform(tree)
        if rewrite is not None:
            node = rewrite(node)
        return _Checker(rule).resolve(node)


__all__ = ["MAX_REGEX_CHARS", "parse_expression"]
