"""Which verify path a method ran (`verify_paths` in its results, TEAM.md's contract: {label: rounds}, label
`one-forward` or `reference: <reason>`) is shown beside the method in the table, --json, csv and md; a method any of
whose rounds took the reference path is flagged REFERENCE PATH with the reason, so that a fallback's speed is never
read as the method's. Results are untrusted: exactly that shape is read, anything else refuses the file."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest

from ddops.bench.report import Labeled, aggregate, build_report, group_columns, groups_markdown, to_csv, to_json
from ddops.bench.summarize_ddtree import summarize_ddtree
from ddops.bench.summary import ResultFileError

REASON = "reference: the Gated DeltaNet layer's conv is not the one the route knows"


def result(paths_per_response, method="ddtree_tb8"):
    responses = []
    for paths in paths_per_response:
        tree = SimpleNamespace(time_per_output_token=0.01, acceptance_lengths=[3.0], output_ids=[1, 2, 3])
        if paths is not None:
            tree.verify_paths = paths
        responses.append({"baseline": SimpleNamespace(time_per_output_token=0.03, output_ids=[1, 2, 3]),
                          method: tree})
    return {"responses": responses, "args": {"dataset": "gsm8k", "temperature": 0.0, "model_name_or_path": "m"}}


def report_of(*paths_per_response):
    return build_report([Labeled("h1", "r", s) for s in summarize_ddtree(result(paths_per_response), "r.pt")])


def test_the_rounds_of_each_path_are_added_over_the_responses():
    (_, tree) = summarize_ddtree(result([{"one-forward": 30}, {"one-forward": 20, REASON: 5}]), "r.pt")
    assert tree.verify_paths == (("one-forward", 50), (REASON, 5))


def test_a_method_that_only_took_the_one_forward_path_shows_it_and_is_not_flagged():
    report = report_of({"one-forward": 12}, {"one-forward": 9})
    tree = next(r for r in report.rows if r.method == "ddtree_tb8")
    assert "REFERENCE PATH" not in tree.flags and tree.note == ""
    headers, cells = group_columns(aggregate(report, "host"))
    assert headers[headers.index("Method") + 1] == "Verify"
    assert [row[headers.index("Verify")] for row in cells] == ["—", "one-forward"]


def test_a_method_whose_rounds_took_the_reference_path_is_flagged_with_the_reason_everywhere():
    report = report_of({"one-forward": 30}, {REASON: 10})
    (group,) = [g for g in aggregate(report, "host") if g.method == "ddtree_tb8"]
    assert "REFERENCE PATH" in group.flags
    assert group.note == ("REFERENCE PATH: 10 of 40 verify rounds took the reference path (the Gated DeltaNet "
                          "layer's conv is not the one the route knows): this speed is the slow exact fallback's, "
                          "not the one-forward verify's")
    headers, cells = group_columns([group])
    assert cells[0][headers.index("Verify")] == f"one-forward (30 rounds), {REASON} (10 rounds)"
    md = groups_markdown([group])
    assert "⚠ REFERENCE PATH" in md and "10 of 40 verify rounds took the reference path" in md
    doc = json.loads(to_json(report))
    (row,) = [r for r in doc["rows"] if r["method"] == "ddtree_tb8"]
    assert row["verify_paths"] == {"one-forward": 30, REASON: 10} and "REFERENCE PATH" in row["flags"]
    assert doc["reference_path"] and "10 of 40" in doc["reference_path"][0]
    lines = {r["method"]: r for r in csv.DictReader(io.StringIO(to_csv(report)))}
    assert lines["ddtree_tb8"]["verify_paths"] == f"one-forward=30;{REASON}=10"
    assert lines["baseline"]["verify_paths"] == ""
    by_host = {r["method"]: r for r in csv.DictReader(io.StringIO(to_csv(report, "host")))}
    assert "REFERENCE PATH" in by_host["ddtree_tb8"]["flags"]


def test_every_round_on_the_reference_path_says_so():
    report = report_of({REASON: 4})
    (tree,) = [r for r in report.rows if r.method == "ddtree_tb8"]
    assert tree.note.startswith("REFERENCE PATH: every verify round took the reference path")


def test_results_without_verify_paths_show_no_verify_column():
    report = report_of(None, None)
    assert "Verify" not in group_columns(aggregate(report, "host"))[0]
    assert all(r["verify_paths"] is None for r in json.loads(to_json(report))["rows"])


@pytest.mark.parametrize("paths, says", [
    ({"fast": 3}, "is not `one-forward` or `reference: <reason>`"),
    ({"one-forward": 2.5}, "not a count of rounds"),
    ({"one-forward": -1}, "not a count of rounds"),
    ({"one-forward": True}, "not a count of rounds"),
    (["one-forward"], "not a dict"),
    ({"reference: " + "x" * 400: 1}, "is not `one-forward`"),
])
def test_a_verify_paths_field_of_another_shape_refuses_the_file_naming_where(paths, says):
    with pytest.raises(ResultFileError, match="responses\\[0\\].ddtree_tb8.verify_paths") as info:
        summarize_ddtree(result([paths]), "h1/r.pt")
    assert says in str(info.value)


@pytest.mark.torch
def test_verify_paths_in_a_real_pt_file_load_through_the_untrusted_reader(tmp_path):
    torch = pytest.importorskip("torch")
    from ddops.bench.results import summarize_file

    data = result([{"one-forward": torch.tensor(7)}, {REASON: 2}])
    torch.save(data, tmp_path / "r.pt")
    (_, tree) = summarize_file(tmp_path / "r.pt", "ddtree")
    assert tree.verify_paths == (("one-forward", 7), (REASON, 2))
