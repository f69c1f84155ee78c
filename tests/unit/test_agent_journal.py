"""The agent's journal reader: entries of a newer ddops skipped, malformed ones refused by line, torn lines read as
far as they go, and a rollback refused when the journal moved since it was planned."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.test_agent import (ORIGINAL, PATCHED, PATCHED_AGAIN, change, commit_payload, fails, journal, ok, repo,
                                   rollback_payload, sha)

__all__ = ["repo"]  # the fixture, shared with test_agent.py


def journal_file(repo: Path) -> Path:
    return repo / ".ddops" / "journal.jsonl"


def append_line(repo: Path, line: str) -> None:
    with open(journal_file(repo), "a") as handle:
        handle.write(line + "\n")


def test_an_entry_of_a_newer_ddops_without_a_file_is_skipped_by_every_reader(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    append_line(repo, json.dumps({"event": "x-from-a-newer-ddops", "id": "x"}))
    append_line(repo, json.dumps({"event": "x-other", "file": ["odd"], "patch": {"a": 1}, "id": ["unhashable"]}))
    assert [e["event"] for e in journal(repo)] == ["apply"]
    snap = ok("snapshot", {"repo": str(repo), "files": ["ddtree.py"]})
    assert [e["event"] for e in snap["journal"]] == ["apply"] and snap["journal_corrupt"] == []
    # A later write still works, and is read after the unknown entries.
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))
    assert [e["after"] for e in journal(repo)] == [sha(PATCHED), sha(PATCHED_AGAIN)]


def test_a_malformed_entry_of_a_known_event_is_refused_naming_its_line(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    entry = json.loads(journal_file(repo).read_text().splitlines()[0])
    append_line(repo, json.dumps(dict(entry, patch=["hybrid-cache"], id="second")))
    for verb, payload in (("journal", {"repo": str(repo)}),
                          ("snapshot", {"repo": str(repo), "files": ["ddtree.py"]}),
                          ("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL) | {"journal_last": "x"})):
        error = fails(verb, payload)
        assert error["kind"] == "bad_journal", (verb, error)
        assert ".ddops/journal.jsonl line 2: `patch` must be a string or null, not list" in error["message"]
    assert (repo / "ddtree.py").read_bytes() == PATCHED  # the rollback wrote nothing


def test_a_torn_last_line_is_read_as_far_as_it_goes_and_listed_as_torn(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    text = journal_file(repo).read_text()
    journal_file(repo).write_text(text[:text.index(', "time"')])  # cut after the patch id: a power cut mid-append
    result = ok("journal", {"repo": str(repo)})
    assert result["corrupt"] == [{"line": 1, "error": result["corrupt"][0]["error"], "salvaged": True}]
    [entry] = result["entries"]
    assert (entry["event"], entry["file"], entry["patch"], entry["before"], entry["after"], entry["torn"]) == \
        ("apply", "ddtree.py", "hybrid-cache", sha(ORIGINAL), sha(PATCHED), True)
    # Cut inside a hash: not a whole entry, so nothing of it is believed.
    journal_file(repo).write_text(text[:text.index('"before": "') + 20])
    result = ok("journal", {"repo": str(repo)})
    assert result["entries"] == [] and result["corrupt"][0]["salvaged"] is False


def test_a_rollback_planned_from_an_older_journal_is_refused_and_writes_nothing(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    seen = journal(repo)[-1]["id"]
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))  # another controller's patch
    before = journal_file(repo).read_bytes()
    error = fails("rollback", rollback_payload(repo, "ddtree.py", PATCHED_AGAIN, ORIGINAL, force=True)
                  | {"journal_last": seen})
    assert error["kind"] == "journal_moved"
    assert (repo / "ddtree.py").read_bytes() == PATCHED_AGAIN and journal_file(repo).read_bytes() == before
    now = journal(repo)[-1]["id"]
    done = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED_AGAIN, ORIGINAL) | {"journal_last": now})
    assert done["restored"] == ["ddtree.py"]


def old_history(count: int) -> list[dict]:
    """`count` entries of a long-lived host: a patch applied to history.py and rolled back, again and again, a
    foreign edit saved once, and an entry of a newer ddops."""
    entries = []
    for i in range(count // 2):
        entries.append({"event": "apply", "patch": "old", "file": "history.py", "before": "a" * 64, "after": "b" * 64,
                        "time": "2025-01-01T00:00:00.000Z", "id": f"apply-{i}", "actor": "alice@laptop"})
        entries.append({"event": "rollback", "patch": "old", "file": "history.py", "before": "b" * 64,
                        "after": "a" * 64, "time": "2025-01-01T00:00:00.000Z", "id": f"rollback-{i}"})
    entries[10:10] = [{"event": "save-foreign", "patch": None, "file": "history.py", "sha256": "c" * 64,
                       "expected": "b" * 64, "time": "t", "id": "saved"},
                      {"event": "x-from-a-newer-ddops", "id": "x"}]
    return entries


def test_a_journal_over_the_limit_is_compacted_to_its_live_state_and_the_rest_kept_rotated(repo):
    from ddops.patching.backups import saved_edits
    from ddops.patching.journal import active_applications, last_written_by_file

    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    history = old_history(2400)
    lines = [json.dumps(e, sort_keys=True) for e in history]
    lines[500] = lines[500][:60]  # a line cut inside a hash: unreadable, and shown as such after compaction too
    with open(journal_file(repo), "a") as handle:
        handle.write("\n".join(lines) + "\n")
    before = journal_file(repo).read_bytes()
    assert len(before) > 512 * 1024
    full = journal(repo)

    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))

    after = ok("journal", {"repo": str(repo)})
    assert len(journal_file(repo).read_bytes()) < 8 * 1024
    [rotated] = (repo / ".ddops" / "journal-old").iterdir()
    assert rotated.read_bytes().startswith(before)  # every old line kept, in order
    new = [e for e in after["entries"] if e["id"] not in {f["id"] for f in full}]
    assert [e["event"] for e in new] == ["apply"]
    whole = full + new
    def applied(entries: list[dict]) -> list[tuple]:
        return [(a.patch, a.file, a.before, a.after, a.id) for a in active_applications(entries)]

    assert applied(after["entries"]) == applied(whole)
    assert last_written_by_file(after["entries"]) == last_written_by_file(whole)
    assert saved_edits(after["entries"]) == saved_edits(whole)
    [marker] = after["corrupt"]
    assert f"line 502 of .ddops/journal-old/{rotated.name}, where it is kept" in marker["error"]
    # Status, patch and rollback read the checkpoint like the whole journal.
    done = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED_AGAIN, ORIGINAL) | {"journal_last":
                                                                                      after["entries"][-1]["id"]})
    assert done["restored"] == ["ddtree.py"] and (repo / "ddtree.py").read_bytes() == ORIGINAL


def test_a_snapshot_carries_the_live_entries_which_say_what_the_whole_journal_says(repo):
    from ddops.patching.backups import saved_edits
    from ddops.patching.journal import active_applications, last_written_by_file, modified_files

    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL))
    with open(journal_file(repo), "a") as handle:  # a long-lived host's history
        handle.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in old_history(400)))
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED_AGAIN)))
    whole = journal(repo)
    snap = ok("snapshot", {"repo": str(repo), "files": ["ddtree.py", "history.py"]})
    live = snap["journal"]
    assert len(live) < 10 < len(whole)
    assert [e for e in whole if e in live] == live  # a subset, in journal order
    def applied(entries: list[dict]) -> list[tuple]:  # in order; an entry's index in its list only orders them
        return [(a.patch, a.file, a.before, a.after, a.time, a.id) for a in active_applications(entries)]

    assert applied(live) == applied(whole) != []
    assert last_written_by_file(live) == last_written_by_file(whole)
    assert saved_edits(live) == saved_edits(whole)
    shas = {"ddtree.py": sha(PATCHED_AGAIN), "history.py": None}
    assert modified_files(live, shas) == modified_files(whole, shas)
