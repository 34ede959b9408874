"""git in a rollout's sandbox, as the grader runs it: on a repository the agent had full control of.

The agent may have written `.git/config` (a `filter.<name>.clean` command that `git add` runs, a
`core.fsmonitor` hook, `core.worktree` pointing elsewhere, `include.path`), `~/.gitconfig`, hooks,
`.git/info/attributes`, replace refs (`git replace` swaps the blob any checkout reads), an index
with skip-worktree bits that hide changes from `git diff`. Every grader script therefore starts
with `GIT_PRELUDE`: the repository is named explicitly (`GIT_DIR`, `GIT_WORK_TREE`), global and
system config, replace objects and the user's attributes are off, command-scope config disables
hooks and fsmonitor, and `.git/config` is rewritten to the keys git needs to read the repository
(format version, extensions). The grader's own index is a temporary file, never the agent's.

Also here: the agent's patch (`capture_patch`), applying a diff (`apply_patch`), and making sure the
base commit exists, rebuilding it for a directory task whose `.git` the agent deleted.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import secrets
import shlex
import tarfile

from ..sandbox.base import ExecResult, Sandbox

from .loader import BASE_COMMIT_IDENTITY, BUILD_LITTER, GIT_EXCLUDES, GIT_ISOLATION
from .task import Task

__all__ = [
    "GIT_PRELUDE",
    "PatchApplyError",
    "RepositoryLostError",
    "SandboxGitError",
    "apply_patch",
    "capture_patch",
    "ensure_base_commit",
]

GIT_TIMEOUT_S = 120.0

# Command-scope config outranks every file the agent could have written.
_GIT_CONFIG = {
    "safe.directory": "*",  # a container volume may belong to another uid
    "core.pager": "cat",
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.attributesFile": "/dev/null",
    "core.excludesFile": "/dev/null",
    "core.sparseCheckout": "false",
    "core.untrackedCache": "false",
    "diff.external": "",
}
_GIT_ENV = {
    "GIT_CONFIG_COUNT": str(len(_GIT_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(_GIT_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(_GIT_CONFIG.values())},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
}

# Run in the work dir. Old git (< 2.32) ignores GIT_CONFIG_GLOBAL, so HOME points nowhere too.
GIT_PRELUDE = "\n".join(
    [
        *(f"export {key}={shlex.quote(value)}" for key, value in _GIT_ENV.items()),
        'export GIT_DIR="$PWD/.git" GIT_WORK_TREE="$PWD" GIT_CEILING_DIRECTORIES="${PWD%/*}"',
        "export HOME=/nonexistent XDG_CONFIG_HOME=/nonexistent",
        "unset GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "if [ -f .git/config ] && [ ! -L .git/config ]; then",
        "  kept=$(git config --file .git/config --get-regexp"
        " '^(core[.]repositoryformatversion|extensions[.].*)$' || true)",
        "  : > .git/config.harness-gym && printf '%s\\n' \"$kept\" | while read -r key value; do",
        '    [ -n "$key" ] && git config --file .git/config.harness-gym "$key" "$value"',
        "  done",
        "  mv -f .git/config.harness-gym .git/config",
        "fi",
        "rm -f .git/info/attributes .git/config.worktree",
    ]
)


class PatchApplyError(RuntimeError):
    """A diff did not apply; the message holds git's (and patch's) own explanation."""


class RepositoryLostError(RuntimeError):
    """The agent deleted or replaced the sandbox's git repository and it cannot be rebuilt."""


class SandboxGitError(RuntimeError):
    """git in the sandbox failed (no repository, unknown base commit, a timeout)."""


def succeeded(result: ExecResult) -> bool:
    return result.exit_code == 0 and not result.timed_out


def explain(result: ExecResult) -> str:
    """A failed command's exit and the tail of what it said, for error messages."""
    said = (result.stderr + "\n" + result.stdout).strip()[-2000:]
    return f"(exit {result.exit_code}{', timed out' if result.timed_out else ''}) {said}"


def run_git_script(
    sandbox: Sandbox, script: str, *, stdin: bytes | None = None, timeout: float = GIT_TIMEOUT_S
) -> ExecResult:
    """`script` after the prelude, in the work dir."""
    return sandbox.exec(
        GIT_PRELUDE + "\n" + script, cwd=sandbox.workdir, timeout=timeout, stdin=stdin
    )


# --- the base commit ----------------------------------------------------------------------------


def ensure_base_commit(task: Task, sandbox: Sandbox, base: str) -> str | None:
    """Make sure the work dir is a git repo (a real `.git` directory) holding `base`; rebuild it
    from the task's source tree if the agent deleted or replaced `.git`. Returns a note when it
    rebuilt."""
    probe = run_git_script(
        sandbox,
        '[ -d .git ] && [ ! -L .git ] || exit 3\n'
        f"git cat-file -e {shlex.quote(base)}^{{commit}}",
    )
    if succeeded(probe):
        return None
    if probe.exit_code == 127 or probe.timed_out:  # no git in the sandbox, or it hung
        raise SandboxGitError(f"git cannot run in the sandbox {explain(probe)}")
    lost = f"the work dir has no git repository holding base commit {base} (was .git deleted?)"
    if task.repo_dir is None or not task.base_commit:
        raise RepositoryLostError(
            f"{lost}; task {task.instance_id!r} is a dataset row whose base commit exists only in "
            "its image, so the agent's changes cannot be told apart from the original code"
        )
    _rebuild_base_commit(task, sandbox)
    return f"{lost}: rebuilt it from the task's repo/ and graded the agent's files against it"


def _source_tarball(task: Task) -> bytes:
    """The task's `repo/` as a tar, without the build litter `materialize` also leaves out."""
    assert task.repo_dir is not None
    buffer = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = posixpath.basename(info.name)
        return None if any(fnmatch.fnmatch(name, p) for p in BUILD_LITTER) else info

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(task.repo_dir.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


def _rebuild_base_commit(task: Task, sandbox: Sandbox) -> None:
    """Commit the task's source tree into a fresh `.git` (a side work tree, so the agent's files
    stay as they are), then point the index at it. The identity and dates are `materialize`'s,
    so the commit gets the task's `base_commit` hash; anything else is refused."""
    # In HOME, like the grader's other files: some backends give every exec a fresh /tmp.
    tmp = posixpath.join(sandbox.home, f".harness-gym-base-{secrets.token_hex(8)}")
    quoted = shlex.quote(tmp)
    git = "git -c core.autocrlf=false -c commit.gpgsign=false"
    identity = {**GIT_ISOLATION, **BASE_COMMIT_IDENTITY.git_env()}
    script = "\n".join(
        [
            "set -e",
            *(f"export {key}={shlex.quote(value)}" for key, value in identity.items()),
            f"mkdir -p {quoted}/tree",
            f"tar -xf - -C {quoted}/tree",
            "rm -rf .git",
            f"{git} init -q --initial-branch=main",
            f"{git} --work-tree={quoted}/tree add --all --force",
            f"{git} commit -q --no-verify --allow-empty -m {shlex.quote(BASE_COMMIT_IDENTITY.message)}",
            f"printf %s {shlex.quote(GIT_EXCLUDES)} > .git/info/exclude",
            f"rm -rf {quoted}",
            "git rev-parse HEAD",
        ]
    )
    # No prelude: it would rewrite a .git/config that does not exist yet; `init` makes a clean one.
    env = {key: value for key, value in _GIT_ENV.items()}
    result = sandbox.exec(
        script, cwd=sandbox.workdir, env=env, timeout=GIT_TIMEOUT_S, stdin=_source_tarball(task)
    )
    if not succeeded(result):
        raise SandboxGitError(f"could not rebuild the base commit {explain(result)}")
    if (rebuilt := result.stdout.strip().splitlines()[-1]) != task.base_commit:
        raise SandboxGitError(
            f"rebuilt the base commit as {rebuilt}, not {task.base_commit}: the sandbox's git "
            "commits the task's files differently"
        )


# --- the agent's patch --------------------------------------------------------------------------

DIFF_OPTIONS = "--binary --no-color --no-ext-diff --no-textconv --src-prefix=a/ --dst-prefix=b/"


def capture_script(base_commit: str, then: str = "") -> str:
    """Prints the agent's changes against `base_commit`, from a temporary index (the agent's
    own may carry skip-worktree bits that hide edits); `then` runs while that index, holding
    the agent's tree, is still in place."""
    base = shlex.quote(base_commit)
    return "\n".join(
        [
            'export GIT_INDEX_FILE="$GIT_DIR/harness-gym-capture.index"',
            'rm -f "$GIT_INDEX_FILE"',
            f"git read-tree {base} && git add --all && git diff --cached {DIFF_OPTIONS} {base}",
            "rc=$?",
            then,
            'rm -f "$GIT_INDEX_FILE"; unset GIT_INDEX_FILE',
            "[ $rc = 0 ] || exit 80",
        ]
    )


def capture_patch(sandbox: Sandbox, base_commit: str = "HEAD") -> str:
    """The agent's changes against `base_commit`, new files included, binary-safe (ignored files
    are left out). Raises `SandboxGitError`."""
    result = run_git_script(sandbox, capture_script(base_commit))
    if not succeeded(result):
        raise SandboxGitError(f"could not capture the agent's patch {explain(result)}")
    return result.stdout


def apply_patch(
    sandbox: Sandbox, diff: str, *, allow_fuzz: bool = True, timeout_s: float = GIT_TIMEOUT_S
) -> None:
    """Apply a git diff to the sandbox's working tree (e.g. a gold patch, to validate a task).

    `git apply` first; with `allow_fuzz`, then `patch --fuzz=5` as SWE-bench's harness does for
    patches whose context drifted (dry-run first: `patch` would otherwise leave the hunks that
    fit applied and the rest in `.rej` files). Raises `PatchApplyError` with both tools'
    messages; a malformed or truncated diff is one of those, never another exception.
    """
    if not isinstance(diff, str):
        raise PatchApplyError(f"a diff must be text, got {type(diff).__name__}")
    if not diff.strip():
        return
    data = diff.encode("utf-8", errors="surrogateescape")
    if not data.endswith(b"\n"):
        data += b"\n"  # a diff cut at its last line reads as "corrupt patch"
    fuzzy = 'patch --batch --forward --fuzz=5 -p1 -i "$diff"'
    attempts = ["git apply --verbose --whitespace=nowarn -"]
    if allow_fuzz:  # stdin is read twice: keep it in a file
        attempts.append(
            f'diff=$(mktemp) && cat > "$diff" && {fuzzy} --dry-run && {fuzzy}; '
            'rc=$?; rm -f "$diff"; exit $rc'
        )
    messages = []
    for command in attempts:
        result = run_git_script(sandbox, command, stdin=data, timeout=timeout_s)
        if succeeded(result):
            return
        tool = "git apply" if command.startswith("git") else "patch --batch"
        messages.append(f"{tool} {explain(result)}")
    if "\n@@ " not in diff and "GIT binary patch" not in diff:
        first_line = diff.lstrip().splitlines()[0][:80]
        messages.append(f"it has no hunks, so it is not a unified diff (it starts {first_line!r})")
    raise PatchApplyError("\n".join(messages))
