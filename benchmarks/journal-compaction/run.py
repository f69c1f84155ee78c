#!/usr/bin/env python3
"""Journal compaction: what 100k journal entries cost every status, patch and rollback, before and after.

    python benchmarks/journal-compaction/run.py [--entries 100000]

Makes a repo in a temporary directory whose journal holds N entries of a long-lived host (a patch applied to one
file and rolled back, over and over), then times, with the real agent run as the transport runs it (bootstrap,
bundle and request on stdin; one process per request, as with `agent_linger: 0`):
  - `snapshot` of the whole journal (what status and patch read), and the controller parsing it,
  - the `commit` that finds the journal over the limit and compacts it,
  - `snapshot` again, and the controller parsing what it now sends.
Prints the figures; ratios are from one run on one machine (see RESULTS.md beside this file).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ddops.patching.journal import active_applications, last_written_by_file  # noqa: E402
from ddops.transport.agent import agent_program  # noqa: E402

ORIGINAL = b"past_key_values_target = DynamicCache()\n"
PATCHED = b"past_key_values_target = DynamicCache(config=model.config)\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def call(verb: str, payload: dict) -> tuple[dict, float, int]:
    """(result, seconds, answer bytes) of one agent request."""
    program = agent_program()
    request = json.dumps({"verb": verb, "payload": payload}).encode()
    started = time.perf_counter()
    done = subprocess.run(program.argv(sys.executable, cache=False), input=program.bundle + request,
                          capture_output=True, timeout=600, check=True)
    seconds = time.perf_counter() - started
    answer = json.loads(done.stdout)
    assert answer["ok"], answer
    return answer["result"], seconds, len(done.stdout)


def parse_seconds(entries: list[dict]) -> float:
    started = time.perf_counter()
    active_applications(entries)
    last_written_by_file(entries)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / ".git" / "info").mkdir(parents=True)
        (repo / "ddtree.py").write_bytes(ORIGINAL)
        state = repo / ".ddops"
        state.mkdir(mode=0o700)
        with open(state / "journal.jsonl", "w") as handle:
            for i in range(args.entries // 2):
                for event, before, after in (("apply", "a" * 64, "b" * 64), ("rollback", "b" * 64, "a" * 64)):
                    handle.write(json.dumps({"event": event, "patch": "old", "file": "history.py", "before": before,
                                             "after": after, "time": "2025-01-01T00:00:00.000Z", "id": f"{event}-{i}",
                                             "actor": "alice@laptop", "ddops_version": "0.1.0"}, sort_keys=True) + "\n")
        size = (state / "journal.jsonl").stat().st_size
        snapshot = {"repo": str(repo), "files": ["ddtree.py"]}
        before, before_s, before_bytes = call("snapshot", snapshot)
        before_parse = parse_seconds(before["journal"])
        change = {"path": "ddtree.py", "patch_ids": ["hybrid-cache"], "expected_sha256": sha(ORIGINAL),
                  "new_content_b64": base64.b64encode(PATCHED).decode(), "new_sha256": sha(PATCHED)}
        _, commit_s, _ = call("commit", {"repo": str(repo), "actor": "bench", "changes": [change], "post_checks": [],
                                         "lock_timeout": 5})
        after, after_s, after_bytes = call("snapshot", snapshot)
        after_parse = parse_seconds(after["journal"])
        rotated = list((state / "journal-old").glob("*.jsonl"))
        print(f"journal: {args.entries} entries, {size / 1e6:.1f} MB")
        print(f"snapshot before compaction: {before_s:.2f} s, answer {before_bytes / 1e6:.1f} MB, "
              f"{len(before['journal'])} entries; controller parse {before_parse:.2f} s")
        print(f"commit that compacts it:    {commit_s:.2f} s (rotated: {len(rotated)} file, "
              f"{rotated[0].stat().st_size / 1e6:.1f} MB)")
        print(f"snapshot after compaction:  {after_s:.2f} s, answer {after_bytes / 1e3:.1f} kB, "
              f"{len(after['journal'])} entries; controller parse {after_parse * 1e3:.2f} ms")
        print(f"snapshot speed-up: {before_s / after_s:.1f}x (same run, same machine)")


if __name__ == "__main__":
    main()
