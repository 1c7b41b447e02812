"""Judge decoding for text (#51): ``generate_text(acceptance="judge")`` on the shipped pair, the code
outcome checks it is trained and measured on, its label rule, its threshold rule and its errors."""

import pytest
import torch

from visualspec.assets import TEXT_PAIR as PAIR
from visualspec.eval.code import (JUDGE_FILES, REPORT_FILES, held_out_code, held_out_files, is_valid, kept_outcome,
                                  kept_share, next_statement, python_status, statement_key)
from visualspec.models.feature_drafter import weights_hash
from visualspec.models.judge import JudgeHead
from visualspec.text import generate_text
from visualspec.tools.bench_text import load_pair
from visualspec.training.judge import pick_threshold
from visualspec.training.text_judge import label, left_padded

PROMPT = "import os\n\n\ndef join_all(paths):\n    "


@pytest.fixture(scope="module")
def pair():
    return load_pair(PAIR)


def head_for(target, bias: float, threshold: float = 0.5) -> JudgeHead:
    """A judge for ``target`` whose score is sigmoid(bias) for every draft."""
    head = JudgeHead(feature_size=target.config.hidden_size, threshold=threshold, target_hash=weights_hash(target))
    with torch.no_grad():
        head.net.bias.fill_(bias)
    return head.eval()


# ---------------------------------------------------------------------------------- the rule in generate_text


def test_the_shipped_judge_is_small_fits_its_target_and_says_what_it_was_trained_on(pair):
    from visualspec.models.judge import check_judge

    folder = PAIR / "judge"
    assert sum(f.stat().st_size for f in folder.iterdir()) < 16 * 2**10
    head = JudgeHead.from_pretrained(folder)
    check_judge(head, pair[1], pair[1].config.hidden_size)  # raises for another target
    assert 0.0 <= head.config.threshold <= 1.0 and "valid Python" in head.config.outcome


def test_a_judge_that_keeps_nothing_is_the_exact_rule_and_one_that_keeps_all_takes_every_draft(pair):
    """Control: a judge scoring 0 leaves the exact decode (generate's tokens, as many forwards). A
    judge scoring 1 keeps every draft the rule rejected, so it counts judged tokens and takes fewer
    target forwards."""
    tokenizer, target, draft = pair
    kw = dict(drafter=draft, window=6, max_new_tokens=40, temperature=0)
    exact = generate_text(target, tokenizer, PROMPT, **kw)
    none = generate_text(target, tokenizer, PROMPT, acceptance="judge", judge=head_for(target, -30.0), **kw)
    assert none.token_ids == exact.token_ids
    assert none.stats.judged_tokens == 0 and none.stats.target_forwards == exact.stats.target_forwards
    every = generate_text(target, tokenizer, PROMPT, acceptance="judge", judge=head_for(target, 30.0), **kw)
    assert every.stats.judged_tokens > 0
    assert every.stats.target_forwards < exact.stats.target_forwards
    # the threshold decides: above every score, nothing is kept
    strict = generate_text(target, tokenizer, PROMPT, acceptance="judge", judge=head_for(target, 30.0),
                           judge_threshold=1.0, **kw)
    assert strict.token_ids == exact.token_ids and strict.stats.judged_tokens == 0


def test_a_judge_reads_the_targets_features_at_the_draft_columns(pair):
    """A judge that keeps drafts only where the target's feature points one way keeps some and not
    others: its score depends on the feature it is handed, not on a constant."""
    tokenizer, target, draft = pair
    head = head_for(target, 0.0)
    with torch.no_grad():
        head.net.weight.zero_()
        head.net.weight[0, 0] = 50.0  # the first feature's sign (standardised by mean 0, scale 1)
    out = generate_text(target, tokenizer, PROMPT, drafter=draft, window=6, max_new_tokens=48, temperature=0,
                        acceptance="judge", judge=head)
    every = generate_text(target, tokenizer, PROMPT, drafter=draft, window=6, max_new_tokens=48, temperature=0,
                          acceptance="judge", judge=head_for(target, 30.0))
    assert 0 < out.stats.judged_tokens < every.stats.judged_tokens


def test_a_judge_folder_loads_and_judge_decoding_compiles(pair, tmp_path):
    tokenizer, target, draft = pair
    head_for(target, 30.0).save_pretrained(tmp_path / "judge")
    kw = dict(drafter=draft, window=2, max_new_tokens=24, temperature=0, acceptance="judge",
              judge=str(tmp_path / "judge"))
    eager = generate_text(target, tokenizer, PROMPT, **kw)
    compiled = generate_text(target, tokenizer, PROMPT, compile=True, **kw)
    assert compiled.token_ids == eager.token_ids and eager.stats.judged_tokens > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(acceptance="judge"), "needs a judge"),
    (dict(judge="JUDGE"), "for acceptance='judge'"),
    (dict(acceptance="exact", judge_threshold=0.5), "for acceptance='judge'"),
    (dict(acceptance="judge", judge="MISSING"), "not a judge folder"),
    (dict(acceptance="judge", judge="JUDGE", judge_threshold=1.5), "threshold"),
    (dict(acceptance="judge", judge="JUDGE", drafter=None), "give a drafter"),
    (dict(acceptance="judge", judge="OTHER"), "trained against a target"),
])
def test_bad_judge_arguments_are_named(pair, tmp_path, kwargs, message):
    tokenizer, target, draft = pair
    head_for(target, 0.0).save_pretrained(tmp_path / "judge")
    other = JudgeHead(feature_size=target.config.hidden_size, target_hash="0123456789abcdef")
    other.save_pretrained(tmp_path / "other")
    names = {"JUDGE": str(tmp_path / "judge"), "OTHER": str(tmp_path / "other"), "MISSING": str(tmp_path / "none")}
    kwargs = {k: names.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    kwargs.setdefault("drafter", draft)
    with pytest.raises(ValueError, match=message):
        generate_text(target, tokenizer, PROMPT, max_new_tokens=8, temperature=0, **kwargs)


# ---------------------------------------------------------------------------------- the outcome checks


@pytest.mark.parametrize("source, status", [
    ("x = 1\n", "complete"), ("def f():\n", "incomplete"), ("def f():\n    return (1,\n", "incomplete"),
    ('s = """doc\n', "incomplete"), ("x = = 1\n", "invalid"), ("def f():\n    x = 1\n  y = 2\n", "invalid"),
    ("if x:\n    pass\nelse\n", "invalid"),
])
def test_python_status_tells_unfinished_input_from_errors(source, status):
    assert python_status(source) == status


def test_validity_reads_only_the_complete_lines_in_their_file():
    context = "class A:\n    def f(self):\n"
    assert is_valid(context, "        return 1\n    def g(")  # the unfinished last line is not read
    assert not is_valid(context, "        return = 1\n")
    assert not is_valid("x = (\n", "]\n")  # the file's open bracket is what the continuation must close


def test_statements_ignore_comments_and_spacing_and_count_as_a_multiset():
    assert statement_key("    x  =  f(a)   # note\n") == "x = f(a)"
    assert statement_key("    # only a comment\n") == "" and statement_key("\n") == ""
    assert next_statement("a = 1\n\n# c\nb = 2\nc", 2) == ("b = 2", 17)
    assert next_statement("a = 1\nb = 2", 0) is None  # the next line is not complete yet
    exact = "a = 1\nb = 2\nb = 2\n"
    assert kept_share("b = 2  # same\na = 1\n", exact) == pytest.approx(2 / 3)
    assert kept_outcome("", "a = 1\nb = 2\nb = 2\n", exact) == 1.0
    assert kept_outcome("", "a = = 1\nb = 2\nb = 2\n", exact) == 0.0  # invalid: nothing kept


def test_code_prompts_are_line_cuts_of_valid_files_and_the_judges_files_are_not_the_reports(pair):
    tokenizer = pair[0]
    judge, report = set(held_out_files(PAIR, JUDGE_FILES)), set(held_out_files(PAIR, REPORT_FILES))
    assert judge and report and not judge & report and judge | report == set(held_out_files(PAIR))
    prompts = held_out_code(PAIR, tokenizer, 6, seed=1, files=REPORT_FILES)
    assert len(prompts) == 6 and all(p.file in report for p in prompts)
    root = __import__("sysconfig").get_paths()["stdlib"]
    for p in prompts:
        assert p.context.endswith("\n") and python_status(p.context) != "invalid"
        assert p.context.endswith(p.prompt[-40:])  # the model reads the end of what the checks read
        source = open(f"{root}/{p.file}", encoding="utf-8", errors="replace").read()
        assert source.startswith(p.context + p.truth) and p.truth.count("\n") == 12  # the file's next lines
    with pytest.raises(ValueError, match="files must be"):
        held_out_files(PAIR, "train")


# ---------------------------------------------------------------------------------- labels and threshold


def test_a_label_is_harmless_only_when_the_code_stays_valid_and_keeps_the_next_statement():
    class Chars:  # a tokenizer whose tokens are characters
        def decode(self, ids):
            return "".join(map(chr, ids))

    def ids(text):
        return [ord(c) for c in text]

    tok, before = Chars(), ids("x = ")
    chosen, rest = ord("1"), ids("\ny = 2\n")
    assert label("", tok, before, chosen, ord("3"), rest, rest) is True  # another number, same next line
    assert label("", tok, before, chosen, ord("3"), rest, ids("\ny = 4\n")) is False  # the next line changed
    assert label("", tok, before, chosen, ord("="), rest, rest) is False  # x = = ...: a syntax error
    assert label("", tok, before, chosen, ord("3"), rest, ids("\ny = 4")) is None  # no complete next line


def test_the_threshold_rule_takes_the_lowest_passing_candidate_or_the_exact_rule():
    assert pick_threshold({0.2: 0.60, 0.5: 0.695, 0.8: 0.71}, exact=0.70, max_drop=0.01) == 0.5
    assert pick_threshold({0.2: 0.5, 0.5: 0.6}, exact=0.70, max_drop=0.01) == 1.0


def test_left_padded_prefixes_keep_each_row_at_the_right():
    ids, mask = left_padded([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# ---------------------------------------------------------------------------------- bench-text --judge


def test_bench_text_judge_rows_use_the_same_drafts_and_report_validity(pair, tmp_path, capsys):
    """The judge's rows sit beside the exact draft model rows on the report files' line-cut prompts;
    every row reports validity and statements kept, generate's own statements kept being its
    validity. A judge that keeps every draft takes fewer forwards than the exact rule."""
    import json

    from visualspec.tools.cli import main

    head_for(pair[1], 30.0).save_pretrained(tmp_path / "judge")
    rows = ["visualspec draft model, fixed window 6", "visualspec draft model, fixed window 6, judge"]
    assert main(["bench-text", "--prompts", "2", "--new-tokens", "24", "--compile", "off", "--judge",
                 str(tmp_path / "judge"), "--only", *rows]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompt_files"].startswith("report") and set(result["results"]) == {"generate", *rows}
    exact, judged, ref = (result["results"][k] for k in (*rows, "generate"))
    assert judged["target_forwards"] < exact["target_forwards"]
    assert exact["greedy_output_equal"] == "2/2" and exact["statements_kept"] == ref["statements_kept"] == ref["valid"]
    assert exact["statements_right"] == ref["statements_right"]
    assert all(0.0 <= r[k] <= 1.0 for r in (exact, judged) for k in ("valid", "statements_kept", "statements_right"))


@pytest.mark.parametrize("argv, message", [
    (["--judge-thresholds", "0.5"], "needs --judge"),
    (["--judge", "JUDGE", "--judge-thresholds", "2"], r"in \[0, 1\]"),
    (["--judge", "MISSING"], "not a judge folder"),
])
def test_bench_text_names_bad_judge_options(tmp_path, capsys, argv, message):
    import re

    from visualspec.tools.cli import main

    JudgeHead(feature_size=256).save_pretrained(tmp_path / "judge")
    argv = [{"JUDGE": str(tmp_path / "judge"), "MISSING": str(tmp_path / "none")}.get(a, a) for a in argv]
    assert main(["bench-text", "--prompts", "1", "--compile", "off", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


# ---------------------------------------------------------------------------------- train-judge --pair


def test_the_text_recipe_writes_a_judge_for_its_target_and_resumes(pair, tmp_path):
    """A small run of the whole recipe: labels mined, a head fitted, a threshold picked from the
    tuned candidates (or 1.0), the folder loadable by generate_text; a rerun reads every stage back."""
    import json

    from visualspec.training.text_judge import TextJudgeConfig, train_text_judge

    cfg = TextJudgeConfig(prompts=8, batch=4, new_tokens=24, continuation=24, tune_prompts=2, prompt_tokens=48,
                          steps=20, drafts_per_prompt=4)
    out = train_text_judge(PAIR, *pair, tmp_path / "judge", tmp_path / "work", cfg, progress=False)
    record = json.loads((out / "training.json").read_text())
    head = JudgeHead.from_pretrained(out)
    assert head.config.target_hash == weights_hash(pair[1])
    assert head.config.threshold in [*record["fit"]["thresholds"], 1.0]
    losses = record["fit"]["l2_validation_bce"]  # the penalty kept is the one that validated best
    assert len(losses) == 3 and losses[str(record["fit"]["l2"])] == min(losses.values())
    assert set(record["tuning"]) == {"exact", *(f"judge@{t}" for t in record["fit"]["thresholds"])}
    assert record["fit"]["labels"] > 0 and sorted(p.name for p in (tmp_path / "work").glob("labels-*.pt")) == [
        "labels-00000.pt", "labels-00004.pt"]
    # a rerun resumes: every stage is read back, the same judge comes out
    again = train_text_judge(PAIR, *pair, tmp_path / "again", tmp_path / "work", cfg, progress=False)
    assert json.loads((again / "training.json").read_text())["fit"] == record["fit"]
    with pytest.raises(ValueError, match="another configuration"):
        train_text_judge(PAIR, *pair, tmp_path / "x", tmp_path / "work", TextJudgeConfig(prompts=9), progress=False)


def test_train_judge_names_options_of_the_other_kind(tmp_path, capsys):
    from visualspec.tools.cli import main

    assert main(["train-judge", "--pair", str(PAIR), "--model", "assets/shapes-t2i", "--out", str(tmp_path)]) == 2
    assert "--model and --prompts-per-task are the shapes judge's" in capsys.readouterr().err
    assert main(["train-judge", "--prompts", "5", "--out", str(tmp_path)]) == 2
    assert "--prompts is the text judge's" in capsys.readouterr().err
