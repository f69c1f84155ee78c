"""A host's pin (`commit:` in the inventory, or --commit) and the one commit it names, resolved once, on the controller.

A branch or tag means what the controller sees: the local clone given with --from (its HEAD, branches and tags, as
that clone has them) or, without one, the host's `repo_url` (`git ls-remote`). Never the host's own refs: a host's
local `main` is whatever it was when it last fetched. sync, deploy, status and the bench preflight all ask `Pins`."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddops.errors import DdopsError, UsageError
from ddops.jsonvalue import JsonValue, omitted_when_none
from ddops.strenum import StrEnum

if TYPE_CHECKING:
    from ddops.inventory import Host

COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
SHORT_SHA_RE = re.compile(r"^[0-9a-f]{7,64}$")
LOCAL_GIT_TIMEOUT = 60.0
STATUS_GIT_TIMEOUT = 15.0


class PinState(StrEnum):
    """What `ddops status` shows for a host's checkout against its pin."""

    AT = "at-pin"            # HEAD is the pinned commit
    OFF = "off-pin"          # HEAD is another commit
    NONE = "no-pin"          # the inventory pins no commit for this host
    NO_REPO = "no-repo"      # no git checkout (or no commit) at the host's repo path
    UNRESOLVED = "unresolved"  # the pin is a branch or tag that could not be resolved
    NOT_ASKED = "not-asked"  # the run was interrupted before this host was asked
    UNKNOWN = "unknown"      # the host did not say (unreachable, or failed before answering)


PIN_AT, PIN_OFF, PIN_NONE, PIN_NO_REPO, PIN_UNRESOLVED, PIN_NOT_ASKED, PIN_UNKNOWN = PinState


class SyncError(DdopsError):
    """A controller-side git step failed (resolving a pin, making a bundle)."""

    kind = "sync"


@dataclass(frozen=True, slots=True)
class Pin:
    """A host's pin (`rev` as written) and the commit it names, or why it could not be resolved."""

    url: str | None
    rev: str | None
    commit: str | None = None
    via: str = ""  # "sha" | "ls-remote" | "clone"
    error: str | None = None
    clone: str | None = None  # the local clone it was resolved in (via "clone")

    @property
    def shown(self) -> str:
        """`main@73068c9` for a branch or tag, `73068c9` for a commit id, the pin as written when unresolved."""
        if not self.commit:
            return self.rev or "no pin"
        if self.via == "sha" or (self.rev and self.commit.startswith(self.rev)):
            return self.commit[:7]
        return f"{self.rev}@{self.commit[:7]}"

    @property
    def resolved_in(self) -> str:
        """Where the commit was found: `the clone /src/ddtree`, `the remote <url>`, or `the inventory` (a sha)."""
        if self.via == "clone":
            return f"the clone {self.clone}"
        if self.via == "ls-remote":
            return f"the remote {self.url}"
        return "the inventory" if self.via == "sha" else "nowhere"

    @property
    def described(self) -> str:
        """`main@73068c9 (resolved in the clone /src/ddtree)`; a commit id as is."""
        return f"{self.shown} (resolved in {self.resolved_in})" if self.via in ("clone", "ls-remote") else self.shown


# -- pure helpers ---------------------------------------------------------------------------------------------------


def is_commit_id(text: str | None) -> bool:
    return bool(text) and bool(COMMIT_RE.match(text or ""))


def short(commit: str | None) -> str:
    return commit[:12] if commit else "nothing"


def pick_ref(ls_remote: str, rev: str) -> str | None:
    """The commit `git ls-remote` output gives for rev, as git would pick it (tags before branches, peeled)."""
    refs: dict[str, str] = {}
    for line in ls_remote.splitlines():
        sha, _, name = line.partition("\t")
        if sha and name:
            refs[name.strip()] = sha.strip()
    for name in (rev, f"refs/{rev}", f"refs/tags/{rev}", f"refs/heads/{rev}"):
        if f"{name}^{{}}" in refs:  # an annotated tag: the commit it points at
            return refs[f"{name}^{{}}"]
        if name in refs and (name == "HEAD" or name.startswith("refs/")):
            return refs[name]
    return None


def pin_state(host: Host, head_commit: str | None, resolved: str | None = None) -> PinState:
    """PIN_AT / PIN_OFF / PIN_NONE / PIN_NO_REPO / PIN_UNRESOLVED for a host whose HEAD is head_commit.

    `resolved` is the commit a branch or tag pin names (see Pins); a full sha pin needs none."""
    if not host.commit and resolved is None:
        return PIN_NONE
    if head_commit is None:
        return PIN_NO_REPO
    pinned = resolved or (host.commit if is_commit_id(host.commit) else None)
    if pinned is None:
        if host.commit and SHORT_SHA_RE.match(host.commit) and head_commit.startswith(host.commit):
            return PIN_AT
        return PIN_UNRESOLVED
    return PIN_AT if head_commit == pinned else PIN_OFF


# -- resolving, on the controller -------------------------------------------------------------------------------------


def local_git(args: Sequence[str], cwd: str | os.PathLike[str] | None = None,
              timeout: float = LOCAL_GIT_TIMEOUT) -> str:
    """stdout of a git command on the controller; SyncError with git's message when it fails."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    env.pop("GIT_DIR", None)
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SyncError("git is not installed on this machine (the controller)") from None
    except subprocess.TimeoutExpired:
        raise SyncError(f"git {args[0]} timed out after {timeout:g}s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise SyncError(f"git {args[0]} failed: {' / '.join(lines[-2:]) or f'exit {done.returncode}'}")
    return done.stdout.strip()


def check_url(url: str) -> None:
    if url.startswith("-"):
        raise SyncError(f"repo_url {url!r} starts with '-': refusing to pass it to git")


GitRunner = Callable[..., str]


def checked_clone(path: str) -> str:
    """--from's clone as an absolute path; UsageError when it is not a directory holding a git clone."""
    clone = Path(path).expanduser()
    if not clone.is_dir():
        raise UsageError(f"--from {path}: not a directory")
    try:
        local_git(["rev-parse", "--git-dir"], cwd=clone)
    except SyncError:
        raise UsageError(f"--from {path}: not a git clone") from None
    return str(clone.resolve())


def resolve_pin(url: str | None, rev: str | None, from_clone: str | None = None,
                timeout: float = LOCAL_GIT_TIMEOUT, git: GitRunner = local_git) -> Pin:
    """The commit rev names: a full sha as is; else in the local clone when one is given (what the user has in
    front of them), else `git ls-remote url`."""
    if not rev:
        return Pin(url, rev, error="no commit pinned: set `commit:` for the host (or its group, or defaults), "
                                   "or pass --commit REV")
    if is_commit_id(rev):
        return Pin(url, rev, rev, via="sha")
    if rev.startswith("-"):
        return Pin(url, rev, error=f"commit {rev!r} starts with '-': refusing to pass it to git")
    problems = []
    if from_clone:
        for candidate in (rev, f"refs/remotes/origin/{rev}"):
            try:
                found = git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{candidate}^{{commit}}"],
                            cwd=from_clone)
                return Pin(url, rev, found, via="clone", clone=from_clone)
            except SyncError:
                continue
        problems.append(f"the local clone {from_clone} has no revision {rev!r}")
    if url:
        try:
            check_url(url)
            commit = pick_ref(git(["ls-remote", "--", url], timeout=timeout), rev)
            if commit:
                return Pin(url, rev, commit, via="ls-remote")
            problems.append(f"{url} has no branch or tag {rev!r}")
        except SyncError as exc:
            problems.append(f"{url}: {exc}")
    if not from_clone:
        problems.append("pass --from LOCAL_CLONE to resolve it from a local clone")
    return Pin(url, rev, error=f"cannot resolve commit {rev!r}: " + "; ".join(problems))


PinKey = tuple["str | None", "str | None"]


class Pins:
    """Every distinct (repo_url, pin) of a run resolved once, whichever host asks first; `rev` overrides each
    host's pin (--commit), `from_clone` is --from."""

    def __init__(self, rev: str | None = None, from_clone: str | None = None, git: GitRunner = local_git,
                 timeout: float = LOCAL_GIT_TIMEOUT) -> None:
        self.rev = rev
        self.from_clone = from_clone
        self.timeout = timeout
        self._git = git
        self._lock = threading.Lock()  # resolutions are rare: hosts of one pin waiting for it is what makes it one
        self._pins: dict[PinKey, Pin] = {}

    def key(self, host: Host) -> PinKey:
        return (host.repo_url, self.rev or host.commit)

    def for_host(self, host: Host) -> Pin:
        key = self.key(host)
        with self._lock:
            pin = self._pins.get(key)
            if pin is None:
                pin = self._pins[key] = resolve_pin(key[0], key[1], self.from_clone, self.timeout, git=self._git)
            return pin

    def resolve_all(self, hosts: Iterable[Host]) -> dict[PinKey, Pin]:
        for host in hosts:
            self.for_host(host)
        with self._lock:
            return dict(self._pins)


@dataclass(frozen=True, slots=True)
class PinSummary(JsonValue):
    """What status shows for a host's pin: its state, the pin as `main@73068c9`, the commit it names, where it was
    resolved, and why it could not be."""

    state: PinState
    pin: str | None
    commit: str | None = None
    resolved_in: str | None = None
    error: str | None = omitted_when_none()

    @property
    def cell(self) -> str:
        """`at-pin main@73068c9`: the state and the pin as the controller resolved it."""
        return f"{self.state} {self.pin}" if self.pin else str(self.state)


def pin_summary(host: Host, head: str | None, pin: Pin | None) -> PinSummary:
    """A host's PinSummary, from its checkout's head and its resolved pin (None: the host has no pin)."""
    if pin is None:
        return PinSummary(pin_state(host, head), host.commit)
    return PinSummary(pin_state(host, head, pin.commit), pin.shown, pin.commit,
                      pin.resolved_in if pin.commit else None, pin.error or None)


def host_pins(hosts: Sequence[Host], heads: Sequence[str | None], pins: Pins | None = None) -> dict[str, PinSummary]:
    """host name -> pin_summary, each distinct pin resolved once on the controller (what `ddops status` shows)."""
    # A table must not wait a minute for an unreachable forge: its pin then shows as unresolved, with why.
    pins = pins or Pins(timeout=STATUS_GIT_TIMEOUT)
    return {h.name: pin_summary(h, head, pins.for_host(h) if h.commit else None) for h, head in zip(hosts, heads)}
