"""200 hosts on one screen: the recap shows the hosts to look at in full (identical rows grouped) and folds the
rest into one count line; small runs and --all-rows show every host. Pure logic, plus one rendering test."""

from __future__ import annotations

import io

from ddops.fleet import FleetEvent, HostResult, fold_recap


def fleet(n_ok: int, failed: dict[str, str], changed: int = 0, skipped: int = 0) -> list[HostResult]:
    results = [HostResult(f"ok{i}", "127.0.0.1", "ok", "", elapsed=0.1) for i in range(n_ok)]
    results += [HostResult(h, "127.0.0.1", "failed", m, elapsed=1.0 + i) for i, (h, m) in enumerate(failed.items())]
    results += [HostResult(f"ch{i}", "127.0.0.1", "changed", "2 files changed") for i in range(changed)]
    results += [HostResult(f"sk{i}", "127.0.0.1", "skipped", "no run here") for i in range(skipped)]
    return results


def test_a_big_fleet_shows_failures_and_changes_in_full_and_counts_the_rest():
    results = fleet(190, {"f1": "exit 1: boom", "f2": "exit 2: other"}, changed=3, skipped=5)
    recap = fold_recap(results)
    assert [(row.hosts, row.status, row.message) for row in recap.rows] == [
        (("f1",), "failed", "exit 1: boom"), (("f2",), "failed", "exit 2: other"),
        (("ch0", "ch1", "ch2"), "changed", "2 files changed")]
    assert recap.folded == {"ok": 190, "skipped": 5}


def test_hosts_with_identical_messages_share_one_row_with_the_longest_time():
    results = fleet(50, {f"f{i}": "unreachable: connection refused" for i in range(4)})
    [row] = fold_recap(results).rows
    assert row.hosts == ("f0", "f1", "f2", "f3") and row.elapsed == 4.0


def test_different_extra_cells_keep_hosts_apart():
    results = fleet(50, {"a": "exit 1", "b": "exit 1"})
    recap = fold_recap(results, cells=lambda r: (r.host[0],))
    assert [row.hosts for row in recap.rows] == [("a",), ("b",)]


def test_small_runs_and_all_rows_show_every_host_on_its_own_row():
    assert len(fold_recap(fleet(5, {"f": "x"})).rows) == 6
    big = fleet(190, {"f": "x"})
    recap = fold_recap(big, all_rows=True)
    assert len(recap.rows) == 191 and recap.folded == {}


def test_the_recap_and_the_progress_bar_as_drawn_on_a_terminal(monkeypatch):
    from rich.console import Console

    from ddops.cli import render

    out = Console(file=io.StringIO(), force_terminal=True, width=150, color_system=None)
    monkeypatch.setattr(render, "console", out)
    render.recap(fleet(190, {"f1": "boom", "f2": "boom"}, changed=1))
    text = out.file.getvalue()
    assert "f[1-2]\u00a0(2)" in text and "boom" in text and "ch0" in text and "ok0" not in text
    assert "190 more hosts ok (--all-rows shows every host)" in text
    assert "193 hosts: 190 ok, 1 changed, 2 failed" in text

    err = Console(file=io.StringIO(), force_terminal=True, width=150, color_system=None)
    bar = render.FleetProgress("patch", [f"h{i}" for i in range(4)], console=err)
    with bar:
        bar.event(FleetEvent("h0", "running"))
        bar.event(FleetEvent("h0", "done", HostResult("h0", "a", "ok", elapsed=0.1)))
        bar.event(FleetEvent("h1", "done", HostResult("h1", "a", "failed", "exit 3", elapsed=0.1)))
        bar.event(FleetEvent("h2", "connecting"))
        plain = Console(file=io.StringIO(), width=150, color_system=None)  # the bar as the terminal shows it
        plain.print(bar._progress.make_tasks_table(bar._progress.tasks))
        drawn = plain.file.getvalue()
    assert "2/4" in drawn and "1 ok" in drawn and "1 failed" in drawn and "1 in flight" in drawn and "eta" in drawn
    assert "h1: failed" in err.file.getvalue() and "h0: ok" not in err.file.getvalue()
