"""Advice that names the line (gpuwhy.stack_advice): each known pattern found in folded
stacks as py-spy's frames give them (library frames, native frames, a source line when one is
known), named at the user's own frame, with its share; the rule's group decides which
patterns may explain it; a process's names are quoted escaped."""

from __future__ import annotations

import pytest

from gpuwhy.stack_advice import PATTERNS, find, parse_frame, sentences

TRAIN = "train.py:80 <module>;train.py:142 train_step"
IDLE = {"role": "main", "stack": "train.py:80 <module>;train.py:95 forward", "count": 60}


def _main(stack: str, count: int = 40) -> list[dict]:
    return [{"role": "main", "stack": stack, "count": count}, IDLE]


# (pattern, the stacks, the rule's id, the sources, what the sentence must say)
CASES = {
    "item": (_main(f"{TRAIN};torch/_tensor.py:1090 __format__"), "R05b_cuda_sync_bound", None,
             "the sync comes from `.item()` at train.py:142 (`train_step`, 40 % of the main "
             "thread's samples): read the value every N steps"),
    "cpu": (_main(f"{TRAIN};libtorch_python.so:0 THPVariable_cpu"), "R06b_cuda_pageable_copies",
            None, "comes from `.cpu()` at train.py:142"),
    "numpy": (_main(f"{TRAIN};torch/_tensor.py:1149 Tensor.__array__"), None, None,
              "comes from `.numpy()` at train.py:142"),
    "synchronize": (_main(f"{TRAIN};torch/cuda/__init__.py:985 synchronize"),
                    "R05_gpu_idle_process_blocked", None,
                    "the sync comes from `torch.cuda.synchronize()` at train.py:142"),
    "print_tensor": (_main(f"{TRAIN};torch/_tensor.py:568 __repr__;"
                           "torch/_tensor_str.py:708 _str"), "R14b_low_gpu_utilisation", None,
                     "the sync comes from `print(tensor)` at train.py:142"),
    "image_decode": ([{"role": "workers", "stack": "worker.py:9 loop;dataset.py:41 load;"
                       "PIL/Image.py:3236 open", "count": 30},
                      {"role": "workers", "stack": "worker.py:9 loop;dataset.py:44 load;"
                       "PIL/ImageFile.py:291 ImageFile.load", "count": 50},
                      {"role": "workers", "stack": "worker.py:9 loop;dataset.py:50 norm",
                       "count": 20}], "R01_input_cpu_bound", None,
                     "the decoding comes from `Image.open`/decode at dataset.py:44 (`load`, "
                     "50 % of the workers' samples)"),
    "pin_memory_off": (_main("train.py:80 <module>;train.py:88 <module>;"
                             "torch/utils/data/dataloader.py:631 __next__;"
                             "torch/utils/data/dataloader.py:1329 _next_data;"
                             "waiting on multiprocessing queue"),
                       "R06_pageable_h2d_copy", None,
                       "the batches are copied from pageable memory: the DataLoader is "
                       "iterated at train.py:88 (`<module>`, 40 %"),
    "tensor_from_ndarray": (_main(TRAIN), "R03_dataloader_synchronous",
                            {"train.py:142": "    x = torch.tensor(batch_array).cuda()"},
                            "the copy from pageable memory comes from "
                            "`torch.tensor(batch_array)` at train.py:142"),
}


def test_every_pattern_has_a_case():
    assert {p.id for p in PATTERNS} == set(CASES)


@pytest.mark.parametrize("pattern", sorted(CASES))
def test_each_pattern_names_the_users_line(pattern):
    stacks, rule_id, sources, said = CASES[pattern]
    found = find(stacks, rule_id, sources)
    assert [a.pattern for a in found][:1] == [pattern], found
    assert said in found[0].sentence


def test_a_source_line_is_quoted_as_the_call_and_escaped():
    [item] = find(_main(TRAIN), "R05b_cuda_sync_bound",
                  {"train.py:142": "total += loss.item()  # <b>x</b>"})
    assert item.quoted == "`loss.item()`"
    assert item.sentence.startswith("the sync comes from `loss.item()` at train.py:142")
    [sync] = find(_main(TRAIN), None, {"train.py:142": "torch.cuda.synchronize(\x1b[2J)"})
    assert sync.pattern == "synchronize" and "\\x1b" in sync.quoted


def test_the_rule_decides_which_patterns_may_explain_it_and_small_shares_say_nothing():
    decode = CASES["image_decode"][0]
    assert find(decode, "R05b_cuda_sync_bound") == []       # a sync answer: no decode advice
    assert {a.pattern for a in find(decode, "R46_cpu_on_far_numa_node")} == {"image_decode"}
    tiny = [{"role": "main", "stack": f"{TRAIN};torch/cuda/__init__.py:985 synchronize",
             "count": 2}, {**IDLE, "count": 98}]
    assert find(tiny) == []                                 # 2 % of the main thread
    # a pin-memory thread anywhere: pin_memory=True, nothing to say
    pinned = [*CASES["pin_memory_off"][0], {"role": "threads", "stack":
              "torch/utils/data/_utils/pin_memory.py:49 _pin_memory_loop;waiting on a lock",
              "count": 100}]
    assert find(pinned, "R06_pageable_h2d_copy") == []


def test_markup_and_odd_frames_stay_plain_values():
    evil = "train.py:7 <script>alert(1)</script>"
    assert parse_frame(evil).function == "<script>alert(1)</script>"
    assert parse_frame("waiting on a lock") is None
    said = sentences([{"role": "main", "stack": f"{evil};torch/cuda/__init__.py:1 synchronize",
                       "count": 5}])
    assert said == ["the sync comes from `torch.cuda.synchronize()` at train.py:7 "
                    "(`<script>alert(1)</script>`, 100 % of the main thread's samples): "
                    "synchronise only where a step is timed (behind a flag), or time with CUDA "
                    "events."]
