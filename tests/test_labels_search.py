"""labels.any_message answers exactly as one MULTILINE search of the joined messages, whichever way it
searches (a line-anchored pattern is searched as a newline and the rest: load/labels.py _line_search);
labels.any_word answers as the Megatron fingerprint's pattern on ASCII text."""

import random
import re

import numpy as np
import pytest

from perfdoctor.classify.communicators import GROUP_START
from perfdoctor.classify.framework import FINGERPRINTS, MEGATRON_NVTX, MEGATRON_WORDS
from perfdoctor.classify.groups import C10D_OP
from perfdoctor.load.labels import _line_search, any_word
from perfdoctor.measure.host import DATA_RANGE, OPTIMIZER_RANGE
from perfdoctor.measure.step_ranges import FRAMEWORK_STEP
from perfdoctor.measure.steps import PROFILER_STEP
from perfdoctor.table import Table

PATTERNS = [DATA_RANGE, OPTIMIZER_RANGE, PROFILER_STEP, C10D_OP, GROUP_START, FRAMEWORK_STEP,
            *(p for p, _ in FINGERPRINTS.values()),
            *map(re.compile, [r"^a|b", r"^a|^b", r"^(x|y)z$", r"(?i)^AB", r"^$", r"^\w*$", r"^b(?<=ab)", r"^(a)\1",
                              r"^.*b$", r"^", r"^\n", r"^a(?m:$)"])]
WORDS = ["a", "b", "ab", "ba", "xz", "yz", "", "aa", "nccl:all_reduce", "ncclGroupStart", "ProfilerStep#3",
         "optimizer", "Optimizer.step#AdamW.step", "data", "enumerate(DataLoader)#x", "fwd mb=1", "Megatron",
         "aten::mm, seq = 5, op_id = 9", "x training_step_3", "m.training_step_12", "run_training_batch", "AB\nc"]


def _joined(rng: random.Random) -> str:
    return "\n".join(rng.choice(WORDS) + rng.choice(["", " ", "x", "\n"]) for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.pattern)
def test_same_answer_as_one_multiline_search(pattern: re.Pattern[str]) -> None:
    rng = random.Random(pattern.pattern)
    search = _line_search(pattern.pattern, pattern.flags)
    plain = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
    for _ in range(400):
        text = _joined(rng)
        assert (search(text) is not None) == (plain.search(text) is not None), text


def test_the_texts_reach_both_answers() -> None:
    rng = random.Random(0)
    texts = [_joined(rng) for _ in range(400)]
    for pattern in PATTERNS[:6]:
        search = _line_search(pattern.pattern, pattern.flags)
        assert {search(t) is not None for t in texts} == {True, False}, pattern.pattern


def test_line_anchored_patterns_take_the_newline_search() -> None:
    """The fast form is what the loader's patterns get (the point of it), not only the fallback."""
    plain = re.compile("^ProfilerStep#").search
    assert _line_search(PROFILER_STEP.pattern, PROFILER_STEP.flags).__name__ == "<lambda>"
    assert _line_search(r"^a|b", re.compile("^a|b").flags).__name__ == plain.__name__


def _nvtx(messages: list[str]) -> Table:
    return Table({"text": np.array(messages, dtype=object)})


def test_megatron_words_answer_as_the_pattern_in_ascii_text() -> None:
    """framework.MEGATRON_WORDS stand for MEGATRON_NVTX wherever the messages are ASCII; elsewhere
    any_word declines (None) and the pattern decides."""
    rng = random.Random(7)
    pieces = ["forward_backward_", "pipelining", "no_", "Forward_Backward_No_Pipelining", "MegaTron", "mega",
              "tron", "FORWARD_backward_pipeliNING", "x", " ", "_", "aten::mm"]
    plain = re.compile(MEGATRON_NVTX.pattern, MEGATRON_NVTX.flags | re.MULTILINE)
    answers = set()
    for _ in range(500):
        messages = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        got = any_word(_nvtx(messages), MEGATRON_WORDS)
        assert got == (plain.search("\n".join(dict.fromkeys(messages))) is not None), messages
        answers.add(got)
    assert answers == {True, False}
    for text in ("forward_bac\u212award_pipelining", "megatron \u0131"):  # the Kelvin sign matches k, ı matches i
        assert any_word(_nvtx([text]), MEGATRON_WORDS) is None
