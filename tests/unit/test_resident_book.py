"""The controller's note of where each host's resident agent listens: a hint kept between commands."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from ddops.transport import resident
from ddops.transport.resident import Resident, ResidentBook, resident_key

KEY = resident_key("root", "10.0.0.7", 22, "python3", "ab" * 32)
SECRET = "5e" * 32



def socket_for(book: ResidentBook, key: str) -> str | None:
    """The socket a resident for `key` was last said to listen on."""
    resident = book.resident_for(key)
    return resident.socket if resident else None

def test_a_recorded_socket_and_its_secret_are_found_by_the_next_command_and_kept_private(tmp_path):
    book = ResidentBook(tmp_path / "cache" / "residents.json")
    book.record(KEY, "/root/.cache/ddops/run/agent-x.sock", SECRET)
    book.save()
    found = ResidentBook(tmp_path / "cache" / "residents.json").resident_for(KEY)
    assert found == Resident("/root/.cache/ddops/run/agent-x.sock", bytes.fromhex(SECRET))
    assert stat.S_IMODE((tmp_path / "cache" / "residents.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


def test_an_entry_without_a_secret_is_never_used(tmp_path):
    path = tmp_path / "residents.json"
    for entry in ({"socket": "/s"}, {"socket": "/s", "secret": "not hex"}, {"socket": "/s", "secret": "ab"}):
        path.write_text(json.dumps({KEY: entry}))
        path.chmod(0o600)
        assert ResidentBook(path).resident_for(KEY) is None


@pytest.mark.parametrize("kind", ["readable by others", "writable by the group", "a symlink", "another user's"])
def test_a_book_that_others_could_have_written_or_read_is_ignored(tmp_path, kind):
    # It names the socket and the secret we trust: whoever could write it could point us at a socket of theirs.
    path = tmp_path / "residents.json"
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({KEY: {"socket": "/s", "secret": SECRET, "seen_at": 1.0}}))
    target.chmod(0o600)
    if kind == "a symlink":
        path.symlink_to(target)
    else:
        target.rename(path)
        if kind == "readable by others":
            path.chmod(0o644)
        elif kind == "writable by the group":
            path.chmod(0o620)
        else:
            if os.geteuid() != 0:
                pytest.skip("needs root to give the file away")
            os.chown(path, 65534, 65534)
    assert ResidentBook(path).resident_for(KEY) is None


def test_the_key_names_user_host_port_python_and_agent_version():
    variants = [("root", "h", 22, "python3", "ab" * 32), ("alice", "h", 22, "python3", "ab" * 32),
                ("root", "h", 2222, "python3", "ab" * 32), ("root", "h", 22, "python3.12", "ab" * 32),
                ("root", "h", 22, "python3", "cd" * 32), ("root", "g", 22, "python3", "ab" * 32)]
    assert len({resident_key(*variant) for variant in variants}) == 6


def test_forgetting_a_gone_resident_removes_it(tmp_path):
    book = ResidentBook(tmp_path / "residents.json")
    book.record(KEY, "/s", SECRET)
    book.save()
    book.forget(KEY)
    book.save()
    assert socket_for(ResidentBook(tmp_path / "residents.json"), KEY) is None
    assert ResidentBook(tmp_path / "residents.json").may_linger(KEY)


def test_a_host_that_refuses_socket_channels_is_not_asked_to_linger_for_a_day(tmp_path, monkeypatch):
    book = ResidentBook(tmp_path / "residents.json")
    book.forget(KEY, prohibited=True)
    book.save()
    again = ResidentBook(tmp_path / "residents.json")
    assert not again.may_linger(KEY) and socket_for(again, KEY) is None
    later = time.time() + resident.PROHIBITED_RETRY_SECONDS + 1
    monkeypatch.setattr(resident.time, "time", lambda: later)
    assert again.may_linger(KEY)


def test_saving_merges_with_what_another_command_wrote_meanwhile(tmp_path):
    path = tmp_path / "residents.json"
    mine, theirs = ResidentBook(path), ResidentBook(path)
    other_key = resident_key("root", "10.0.0.8", 22, "python3", "ab" * 32)
    socket_for(mine, KEY)  # loaded before the other command saved
    theirs.record(other_key, "/theirs", SECRET)
    theirs.save()
    mine.record(KEY, "/mine", SECRET)
    mine.save()
    final = ResidentBook(path)
    assert socket_for(final, KEY) == "/mine" and socket_for(final, other_key) == "/theirs"


def test_a_damaged_or_foreign_file_is_only_a_missed_hint(tmp_path):
    path = tmp_path / "residents.json"
    for content in ("{not json", json.dumps([1, 2]), json.dumps({KEY: "a string, not an entry"}),
                    json.dumps({KEY: {"socket": 42}})):
        path.write_text(content)
        path.chmod(0o600)
        book = ResidentBook(path)
        assert socket_for(book, KEY) is None and book.may_linger(KEY)


def test_an_unwritable_cache_costs_nothing_but_the_hint(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    book = ResidentBook(blocker / "residents.json")
    book.record(KEY, "/s", SECRET)
    book.save()  # no exception
    assert socket_for(book, KEY) == "/s"


def test_the_book_keeps_the_newest_entries_once_full(tmp_path, monkeypatch):
    monkeypatch.setattr(resident, "MAX_ENTRIES", 3)
    book = ResidentBook(tmp_path / "residents.json")
    for index in range(5):
        book.record(f"key{index}", f"/s{index}", SECRET)
        book.save()
    kept = json.loads((tmp_path / "residents.json").read_text())
    assert sorted(kept) == ["key2", "key3", "key4"]
