"""The bootstrap's fast paths: `--serve` (one Python for a session's calls) and the compiled agent cached by hash."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import marshal
import os
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from ddops.transport.agent import AgentProgram, agent_digest, agent_program, agent_source, build_program

# A verb that shows what a request sees of the process it runs in.
PROBE = '''
import os
import sys

from ddops_agent.protocol import verb

CALLS = []


@verb("probe_test")
def probe_test(payload):
    CALLS.append(1)
    return {"pid": os.getpid(), "calls_in_this_load": len(CALLS), "stdin": os.read(0, 100).decode(),
            "no_site": sys.flags.no_site}
'''


def probe_bundle() -> bytes:
    """The shipped bundle plus the probe verb's module."""
    return build_program({"ddops_agent.probe_test": PROBE}).bundle


def digest_of(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def request(verb: str, payload: dict) -> bytes:
    return json.dumps({"verb": verb, "payload": payload}).encode() + b"\n"


def run_bootstrap(source: bytes, stdin: bytes, *, digest: str | None, serve: bool, cache_home: Path,
                  python: str = sys.executable) -> list[dict]:
    """Every JSON line the agent printed; it must exit 0."""
    program = AgentProgram(agent_program().bootstrap, source, digest or "")
    command = shlex.join(program.argv(python, cache=digest is not None, serve=serve))
    done = subprocess.run(["/bin/sh", "-c", command], input=source + stdin, capture_output=True, timeout=60,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache_home)})
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def cached_files(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "ddops").glob("agent-*.marshal"))


def test_serve_answers_one_line_per_request_on_one_agent_loaded_once(tmp_path):
    source = probe_bundle()
    answers = run_bootstrap(source, request("probe_test", {}) * 3, digest=digest_of(source), serve=True,
                            cache_home=tmp_path)
    assert [a["ok"] for a in answers] == [True, True, True]
    results = [a["result"] for a in answers]
    assert len({r["pid"] for r in results}) == 1  # one Python for the whole session
    assert [r["calls_in_this_load"] for r in results] == [1, 2, 3]  # loaded once: not once per request


def test_served_verbs_and_their_children_cannot_read_the_requests_that_follow(tmp_path):
    source = probe_bundle()
    answers = run_bootstrap(source, request("probe_test", {}) + request("probe_test", {}),
                            digest=digest_of(source), serve=True, cache_home=tmp_path)
    assert [a["result"]["stdin"] for a in answers] == ["", ""]


def test_a_failing_request_does_not_end_the_session(tmp_path):
    source = probe_bundle()
    answers = run_bootstrap(source, b"not json\n" + request("frobnicate", {}) + request("probe_test", {}),
                            digest=digest_of(source), serve=True, cache_home=tmp_path)
    assert [a["ok"] for a in answers] == [False, False, True]
    assert [a["error"]["kind"] for a in answers[:2]] == ["bad_request", "unknown_verb"]


def test_the_compiled_agent_is_cached_under_the_source_hash_and_reused(tmp_path, repo_dir):
    source = agent_source()
    journal = request("journal", {"repo": str(repo_dir)})
    first = run_bootstrap(source, journal, digest=agent_digest(), serve=False, cache_home=tmp_path)
    [cache] = cached_files(tmp_path)
    assert agent_digest()[:32] in cache.name and sys.implementation.cache_tag in cache.name
    stamp = cache.stat().st_mtime_ns
    second = run_bootstrap(source, journal, digest=agent_digest(), serve=False, cache_home=tmp_path)
    assert first == second == [{"ok": True, "result": {"entries": [], "corrupt": []}}]
    assert cache.stat().st_mtime_ns == stamp  # read, not rewritten


def test_a_damaged_cache_entry_is_compiled_again(tmp_path, repo_dir):
    source = agent_source()
    journal = request("journal", {"repo": str(repo_dir)})
    run_bootstrap(source, journal, digest=agent_digest(), serve=False, cache_home=tmp_path)
    [cache] = cached_files(tmp_path)
    cache.write_bytes(b"\x00garbage")
    answers = run_bootstrap(source, journal, digest=agent_digest(), serve=False, cache_home=tmp_path)
    assert answers[0]["ok"]
    assert cache.read_bytes() != b"\x00garbage"


def test_a_hash_that_does_not_match_the_source_is_never_used_as_a_cache_key(tmp_path, repo_dir):
    source = agent_source()
    wrong = "0" * 64
    answers = run_bootstrap(source, request("journal", {"repo": str(repo_dir)}), digest=wrong, serve=False,
                            cache_home=tmp_path)
    assert answers[0]["ok"]
    assert cached_files(tmp_path) == []


def test_an_unwritable_cache_directory_only_costs_speed(tmp_path, repo_dir):
    blocker = tmp_path / "ddops"
    blocker.write_text("a file where the cache directory would go")
    answers = run_bootstrap(agent_source(), request("journal", {"repo": str(repo_dir)}), digest=agent_digest(),
                            serve=True, cache_home=tmp_path)
    assert answers == [{"ok": True, "result": {"entries": [], "corrupt": []}}]


def test_facts_still_reports_package_versions_although_python_starts_without_site(tmp_path):
    try:
        expected = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed in this environment")
    source = probe_bundle()
    answers = run_bootstrap(source, request("probe_test", {}) + request("facts", {}), digest=digest_of(source),
                            serve=True, cache_home=tmp_path)
    assert answers[0]["result"]["no_site"] == 1
    assert answers[1]["result"]["versions"]["torch"] == expected


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "ddtree.py").write_text("past_key_values_target = DynamicCache()\n")
    return root


def test_the_cache_keeps_only_the_newest_versions(tmp_path, repo_dir):
    folder = tmp_path / "ddops"
    folder.mkdir()
    for i in range(12):
        stale = folder / f"agent-{i:032d}-old.marshal"
        stale.write_bytes(b"old")
        os.utime(stale, (1_000_000 + i, 1_000_000 + i))
    run_bootstrap(agent_source(), request("journal", {"repo": str(repo_dir)}), digest=agent_digest(), serve=False,
                  cache_home=tmp_path)
    kept = cached_files(tmp_path)
    assert len(kept) == 8
    assert any(agent_digest()[:32] in path.name for path in kept)
    assert (folder / f"agent-{11:032d}-old.marshal") in kept and (folder / f"agent-{0:032d}-old.marshal") not in kept


# A compiled bundle that someone else put in the cache: running it would run their code as us.
PLANTED = '''
import os
open(os.environ["DDOPS_PLANTED_MARKER"], "w").close()
'''


def plant(cache: Path, tmp_path: Path) -> Path:
    """Write, at `cache`, the compiled form of an agent that also runs PLANTED; the marker it would create."""
    poisoned = build_program({"ddops_agent.planted": PLANTED}).bundle
    compiled = [(name, filename, is_package, compile(source, filename, "exec"))
                for name, filename, is_package, source in json.loads(zlib.decompress(poisoned))["modules"]]
    cache.write_bytes(marshal.dumps(compiled))
    return tmp_path / "planted-ran"


@pytest.mark.parametrize("kind", ["a symlink", "writable by others", "in a folder others may write",
                                  "another user's"])
def test_a_cached_agent_that_others_could_have_written_is_compiled_afresh(tmp_path, repo_dir, kind):
    cache_home = tmp_path / "cache"
    cache_home.mkdir()
    journal = request("journal", {"repo": str(repo_dir)})
    run_bootstrap(agent_source(), journal, digest=agent_digest(), serve=False, cache_home=cache_home)
    [cache] = cached_files(cache_home)
    if kind == "a symlink":
        elsewhere = tmp_path / "elsewhere.marshal"
        marker = plant(elsewhere, tmp_path)
        cache.unlink()
        cache.symlink_to(elsewhere)
    else:
        marker = plant(cache, tmp_path)
        if kind == "writable by others":
            cache.chmod(0o666)
        elif kind == "in a folder others may write":
            cache.parent.chmod(0o777)
        else:
            if os.geteuid() != 0:
                pytest.skip("needs root to give the file away")
            os.chown(cache, 65534, 65534)
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "DDOPS_PLANTED_MARKER": str(marker)}
    done = subprocess.run(["/bin/sh", "-c", shlex.join(agent_program().argv(sys.executable))],
                          input=agent_source() + journal, capture_output=True, timeout=60, env=environment)
    assert json.loads(done.stdout) == {"ok": True, "result": {"entries": [], "corrupt": []}}, done.stderr
    assert not marker.exists(), "the planted agent ran"


def test_a_fleet_s_worker_threads_asking_at_once_build_the_agent_program_once(monkeypatch):
    import threading

    from ddops.transport import agent as agent_module
    from tests.conftest import wait_until

    built = []
    release = threading.Event()

    def slow_build() -> AgentProgram:
        built.append(threading.get_ident())
        release.wait(5)  # the first build is still running while every other thread asks
        return AgentProgram("bootstrap", b"bundle", "digest")

    monkeypatch.setattr(agent_module, "build_program", slow_build)
    monkeypatch.setattr(agent_module, "_program", None)
    start = threading.Barrier(16)
    programs = []

    def worker() -> None:
        start.wait()
        programs.append(agent_module.agent_program())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    wait_until(lambda: built)
    release.set()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(programs) == 16 and len({id(p) for p in programs}) == 1
