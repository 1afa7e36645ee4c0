"""``/rules``: every rule with its state (enabled, shadow, thresholds) and last findings;
changing a rule needs the token and goes through ``set_override``, the same function as
``gpuwhy rules set``."""

from __future__ import annotations

from flask import (
    Blueprint,
    abort,
    current_app,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue

from gpuwhy.errors import GpuwhyError, StoreError
from gpuwhy.rules.loader import load_rule_set
from gpuwhy.rules.model import Rule
from gpuwhy.store import open_store, queries
from gpuwhy.store.overrides import OverrideError, read_overrides, set_override
from gpuwhy.webui import error_pages as errors
from gpuwhy.webui.auth import require_token
from gpuwhy.webui.db import get_db

bp = Blueprint("rules", __name__)


def _rule_set() -> dict:
    cache = current_app.extensions.setdefault("gpuwhy.rules", {})
    if "rules" not in cache:
        config = current_app.config["GPUWHY"]
        paths = [p for p in config["rules.paths"].split(":") if p]
        loaded = load_rule_set(paths, builtin=config["rules.builtin"])
        cache["rules"], cache["problems"] = loaded.rules, loaded.problems
    return cache


def all_rules() -> list[Rule]:
    """The rules the service runs (rules.paths and the built-in ones), loaded once per app:
    as in the service, a broken rule costs only itself (see ``rule_problems``)."""
    return _rule_set()["rules"]


def rule_problems() -> list[dict]:
    """The rules that could not be loaded, each with its file:line:column."""
    return [{"path": p.path, "line": p.line, "column": p.column, "message": p.message,
             "where": f"{p.path}:{p.line}:{p.column}"} for p in _rule_set()["problems"]]


def _rule_or_404(rule_id: str) -> Rule:
    found = [r for r in all_rules() if r.id == rule_id]
    if not found:
        abort(404, description=f"no rule {rule_id!r}")
    return found[0]


def rule_states() -> list[dict]:
    db = get_db()
    overrides = read_overrides(db)
    summary = queries.findings_by_rule(db)
    states = []
    for rule in all_rules():
        override = overrides.get(rule.id)
        params = {**rule.params, **(dict(override.params) if override else {})}
        last = summary.get(rule.id, {})
        states.append({"id": rule.id, "title": rule.title, "group": rule.group,
                       "scope": rule.scope, "severity": rule.severity,
                       "enabled": override.enabled if override else True,
                       "shadow": override.shadow if override else False,
                       "params": params, "defaults": dict(rule.params),
                       "findings": last.get("findings", 0), "firing": last.get("firing", 0),
                       "last_finding": last.get("last")})
    return states


def _change(rule: Rule, enabled: str | None, shadow: str | None, thresholds: dict[str, str],
            reset: bool) -> dict:
    db = open_store(current_app.config["DATABASE"])
    try:
        new = set_override(db, rule, enabled, shadow, thresholds, reset=reset)
    finally:
        db.close()
    return {"id": rule.id, "enabled": new.enabled, "shadow": new.shadow,
            "params": dict(new.params)}


@bp.errorhandler(GpuwhyError)
def rules_unreadable(exc: GpuwhyError) -> ResponseReturnValue:
    # A rule file that does not parse: say which, as the CLI does, instead of a bare 500.
    if isinstance(exc, StoreError):            # not the rules: the store, as on every page
        return errors.store_unavailable(exc)
    if request.path.startswith("/api/"):
        return jsonify(error=str(exc)), 500
    return render_template("refused.html", message=f"cannot load the rules: {exc}"), 500


@bp.get("/rules")
def index() -> ResponseReturnValue:
    return render_template("rules.html", rules=rule_states(), problems=rule_problems(),
                           auth=bool(current_app.config["AUTH_TOKEN"]),
                           changed=request.args.get("changed"))


@bp.get("/api/rules")
def api_index() -> ResponseReturnValue:
    return jsonify(rule_states())


@bp.get("/api/rules/problems")
def api_problems() -> ResponseReturnValue:
    return jsonify(rule_problems())


@bp.post("/rules/<rule_id>")
@require_token
def change(rule_id: str) -> ResponseReturnValue:
    rule = _rule_or_404(rule_id)
    form = request.form
    thresholds = {name: form[f"threshold.{name}"] for name in rule.params
                  if form.get(f"threshold.{name}", "").strip()}
    try:
        _change(rule, form.get("enabled") or None, form.get("shadow") or None, thresholds,
                form.get("reset") == "1")
    except OverrideError as exc:
        abort(400, description=str(exc))
    return redirect(url_for("rules.index", changed=rule.id), 303)


@bp.post("/api/rules/<rule_id>")
@require_token
def api_change(rule_id: str) -> ResponseReturnValue:
    rule = _rule_or_404(rule_id)
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return jsonify(error="send a JSON object: enabled, shadow, thresholds, reset"), 400

    def text(value: object) -> str | None:
        return None if value is None else str(value).lower() if isinstance(value, bool) \
            else str(value)

    thresholds = body.get("thresholds") or {}
    if not isinstance(thresholds, dict):
        return jsonify(error="thresholds is an object of NAME: VALUE"), 400
    try:
        new = _change(rule, text(body.get("enabled")), text(body.get("shadow")),
                      {str(k): str(v) for k, v in thresholds.items()}, bool(body.get("reset")))
    except GpuwhyError as exc:
        return jsonify(error=str(exc)), 400
    return jsonify(new)
