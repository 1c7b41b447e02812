"""Outcome measures for generated Python source: is it still valid in its file, and how much of
the real file, or of the target's own continuation, does it write.

Text has no detector that counts what matters, so the text judge (``visualspec train-judge
--text``) is trained and measured on two checks of a continuation in the file it continues:

- **valid**: the file up to the prompt, followed by the continuation cut after its last complete
  line, is not a syntax error for Python's own compiler. Input that is merely unfinished (an open
  block, bracket or string) is valid: a continuation is a file cut short.
- **statements**: its complete lines, each reduced to its code (:func:`statement_key`: no comment,
  whitespace collapsed; blank and comment-only lines dropped).

:func:`kept_outcome` scores a continuation against a reference: 0 where it is invalid, else the
share of the reference's statements it reproduces (as a multiset, anywhere). Against the file's
own next lines (``CodePrompt.truth``) that is how much of the real code it writes, the measure the
text judge is held to; against the exact continuation (the target's own tokens), how much of the
target's code it keeps.

The prompts come with their files (:func:`held_out_code`): cut at a line start of a held-out
standard-library file, the model sees the last ``tokens`` tokens before the cut, the checks see
the whole file up to it, and the file's next lines are the truth.
"""

from __future__ import annotations

import codeop
import io
import json
import sysconfig
import tokenize
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: the held-out files' share the judge is trained and tuned on (every third, sorted by name); reported
#: tables use the others
JUDGE_FILES, REPORT_FILES = "judge", "report"


@dataclass(frozen=True)
class CodePrompt:
    """A prompt cut at a line start: ``prompt`` (what the model reads: the last tokens before the
    cut, decoded), ``context`` (the file up to the cut, what the checks read), ``file``, and
    ``truth``: the file's next lines after the cut (``min_lines`` of :func:`held_out_code`)."""

    prompt: str
    context: str
    file: str
    truth: str = ""


def python_status(source: str) -> str:
    """``"complete"``, ``"incomplete"`` (valid so far, unfinished) or ``"invalid"``: what Python's
    interactive compiler (``codeop``) says of ``source`` as a module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning: invalid escapes and the like are not errors
        try:
            code = codeop.compile_command(source, "<generated>", "exec")
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
            return "invalid"
    return "incomplete" if code is None else "complete"


def complete_lines(text: str) -> str:
    """``text`` cut after its last newline (its complete lines; empty where it has none)."""
    return text[: text.rfind("\n") + 1]


def is_valid(context: str, text: str) -> bool:
    """Whether ``context`` followed by ``text``'s complete lines is valid Python (complete or
    merely unfinished: :func:`python_status`)."""
    return python_status(context + complete_lines(text)) != "invalid"


def statement_key(line: str) -> str:
    """A line's code: its comment removed (where Python's tokenizer reads the line alone) and its
    whitespace collapsed; ``""`` for a blank or comment-only line."""
    try:
        comments = [t for t in tokenize.generate_tokens(io.StringIO(line).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        comments = []
    if comments:
        line = line[: comments[0].start[1]]
    return " ".join(line.split())


def statements(text: str) -> list[str]:
    """The statement keys of ``text``'s complete lines, blank and comment-only lines dropped."""
    return [key for key in map(statement_key, complete_lines(text).split("\n")) if key]


def kept_share(text: str, exact: str) -> float:
    """The share of ``exact``'s statements that ``text`` reproduces (multiset intersection over
    the count of ``exact``'s; 1 where ``exact`` has none)."""
    want = Counter(statements(exact))
    if not want:
        return 1.0
    return sum((Counter(statements(text)) & want).values()) / sum(want.values())


def kept_outcome(context: str, text: str, exact: str) -> float:
    """The outcome of ``text`` against the ``exact`` continuation of the same prompt:
    ``is_valid(context, text) * kept_share(text, exact)``."""
    return float(is_valid(context, text)) * kept_share(text, exact)


def next_statement(text: str, after_char: int) -> tuple[str, int] | None:
    """The first statement that starts on a line after the one holding character ``after_char`` of
    ``text``, and the end of its line (an index into ``text``); None where no such complete line
    is in ``text`` yet."""
    start = text.find("\n", after_char)
    while start >= 0:
        end = text.find("\n", start + 1)
        if end < 0:
            return None
        key = statement_key(text[start + 1:end + 1])
        if key:
            return key, end + 1
        start = end
    return None


#: the standard library of this Python, which a text pair's held-out files are paths into
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def held_out_files(folder, files: str = "all") -> list[str]:
    """A text pair's held-out standard-library files (its ``training.json``): ``"all"``, in the
    record's order, or sorted by name the judge's share (:data:`JUDGE_FILES`: every third) or the
    reports' (:data:`REPORT_FILES`)."""
    names = json.loads((Path(folder) / "training.json").read_text())["held_out_files"]
    if files == "all":
        return names
    if files not in (JUDGE_FILES, REPORT_FILES):
        raise ValueError(f"files must be 'all', {JUDGE_FILES!r} or {REPORT_FILES!r}, got {files!r}")
    return [n for i, n in enumerate(sorted(names)) if (i % 3 == 0) == (files == JUDGE_FILES)]


def read_source(name) -> str:
    """The text of standard-library file ``name`` (a path relative to :data:`STDLIB`)."""
    return (STDLIB / name).read_text(encoding="utf-8", errors="replace")


def held_out_code(folder, tokenizer, count: int, tokens: int = 96, seed: int = 0, files: str = "all",
                  min_lines: int = 12) -> list[CodePrompt]:
    """``count`` prompts cut at random line starts of the pair's held-out files (``files``: see
    :func:`held_out_files`), in turn over the files in a random order, each after at least
    ``tokens`` tokens of its file and with ``min_lines`` lines after it (its ``truth``). Only cuts
    whose context is valid Python (:func:`python_status`) are taken."""
    rng = np.random.default_rng(seed)
    sources = {}
    for name in held_out_files(folder, files):
        text = read_source(name)
        starts = np.cumsum([0] + [len(line) for line in text.splitlines(keepends=True)])
        if len(starts) > 3 * min_lines:
            sources[name] = (text, starts)
    if not sources:
        raise ValueError(f"no held-out file of {folder} ({files}) is long enough for prompts")
    names, prompts, tries = list(rng.permutation(sorted(sources))), [], 0
    while len(prompts) < count:
        tries += 1
        if tries > 50 * count + 100:
            raise ValueError(f"found only {len(prompts)} valid line cuts of {count} in {folder}'s held-out files")
        name = names[tries % len(names)]
        text, starts = sources[name]
        line = int(rng.integers(min_lines, len(starts) - min_lines))
        cut = int(starts[line])
        context = text[:cut]
        ids = tokenizer(context).input_ids
        if len(ids) < tokens or python_status(context) == "invalid":
            continue
        prompts.append(CodePrompt(prompt=tokenizer.decode(ids[-tokens:]), context=context, file=str(name),
                                  truth=text[cut:int(starts[line + min_lines])]))
    return prompts
