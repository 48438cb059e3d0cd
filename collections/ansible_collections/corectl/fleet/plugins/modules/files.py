#!/usr/bin/python
# corectl: one module call for a role's files, directories and links.
from __future__ import annotations

DOCUMENTATION = r"""
module: files
short_description: Bring many files, directories and links to their declared state in one call
description:
  - Each entry of O(files) is a path with its wanted state, content, owner, group and mode, applied
    in order (create a directory before the files in it). A file is rewritten (atomically, fsynced,
    through a temporary file in the same directory) only when its content differs; owner, group and
    mode are corrected where they differ.
  - One module call replaces one copy/template/file task per path (two module runs each for copy and
    template), which is most of what a no-op provision costs per node.
  - The action plugin of the same name renders O(files[].template) and reads O(files[].src) on the
    controller, leaves out entries whose O(files[].when) is false, and notifies the handlers of the
    entries that changed; use the module through it (that is, as a task).
options:
  files:
    description: The paths, in the order they are applied.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path on the node.
        type: path
        required: true
      state:
        description: C(file) (content below), C(directory), C(link) (to O(files[].src)) or C(absent).
        type: str
        choices: [file, directory, link, absent]
        default: file
      content:
        description: The file's text (state C(file)); the action plugin fills it from a template or a role file.
        type: str
      content_b64:
        description: The file's bytes, base64 (state C(file), from a role file that is not text).
        type: str
      src:
        description: The link target (state C(link)).
        type: str
      owner:
        description: Owner name (state C(file) or C(directory)).
        type: str
      group:
        description: Group name (state C(file) or C(directory)).
        type: str
      mode:
        description: Octal mode as a string, such as C("0644") (state C(file) or C(directory)).
        type: str
      validate:
        description:
          - A command that checks the new content before it replaces the file (state C(file)), as
            ansible.builtin.template's C(validate) - C(%s) stands for the path of the new content. It runs only when
            the content differs, on the temporary file in the same directory; a non-zero exit leaves the file as it
            was and fails the task naming the path and the command's last line of output.
        type: str
author: corectl
"""

EXAMPLES = r"""
- name: Write slurm's files
  corectl.fleet.files:
    files:
      - {path: /etc/slurm, state: directory, owner: root, group: root, mode: "0755"}
      - {path: /etc/slurm/slurm.conf, template: slurm.conf.j2, owner: root, group: root, mode: "0644",
         notify: Restart slurmctld}
      - {path: /etc/slurm/topology.conf, state: absent, when: "{{ slurm_switches | length == 0 }}"}
      - {path: /etc/prometheus/rules/corectl.yml, template: rules.yml.j2, validate: promtool check rules %s}
"""

RETURN = r"""
results:
  description: One entry per path applied, in order.
  type: list
  elements: dict
  returned: always
  contains:
    path: {description: The path., type: str}
    changed: {description: Whether this path changed (or would have, in check mode)., type: bool}
changed_paths:
  description: The paths that changed.
  type: list
  elements: str
  returned: always
"""

import base64
import grp
import os
import pwd
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule

MODE = re.compile(r"^0?[0-7]{3,4}$")
DIFF_LIMIT = 64 * 1024


class Refused(Exception):
    """A path that cannot be brought to its state (named in the message)."""


def _ids(entry: dict) -> tuple[int, int]:
    uid = gid = -1
    if entry.get("owner") is not None:
        try:
            uid = pwd.getpwnam(entry["owner"]).pw_uid
        except KeyError:
            raise Refused(f"{entry['path']}: no user {entry['owner']!r}") from None
    if entry.get("group") is not None:
        try:
            gid = grp.getgrnam(entry["group"]).gr_gid
        except KeyError:
            raise Refused(f"{entry['path']}: no group {entry['group']!r}") from None
    return uid, gid


def _mode(entry: dict) -> int | None:
    mode = entry.get("mode")
    if mode is None:
        return None
    if not MODE.match(mode):
        raise Refused(f'{entry["path"]}: mode {mode!r} is not an octal string such as "0644"')
    return int(mode, 8)


def _attributes(path: str, uid: int, gid: int, mode: int | None, check: bool) -> bool:
    """Owner, group and mode of an existing path; True when one differed."""
    st = os.lstat(path)
    changed = False
    if uid not in (-1, st.st_uid) or gid not in (-1, st.st_gid):
        changed = True
        if not check:
            os.lchown(path, uid, gid)
    if mode is not None and stat.S_IMODE(st.st_mode) != mode:
        changed = True
        if not check:
            os.chmod(path, mode)
    return changed


# runs a command (argv) and gives its exit status and output; the module's run_command on a node
Runner = Callable[[list[str]], tuple[int, str, str]]


def _validated(path: str, temporary: str, command: str | None, run: Runner | None) -> None:
    """Refuse the new content of path (in temporary) when the entry's validate command fails on it."""
    if not command:
        return
    if "%s" not in command:
        raise Refused(f"{path}: validate needs %s (where the new content's path goes): {command!r}")
    if run is None:
        raise Refused(f"{path}: validate cannot run here")
    argv = [temporary if word == "%s" else word.replace("%s", temporary) for word in shlex.split(command)]
    rc, out, err = run(argv)
    if rc != 0:
        said = [line.strip() for line in (err + "\n" + out).splitlines() if line.strip()]
        last = said[-1].replace(temporary, path) if said else "no output"
        raise Refused(f"{path}: the new content fails {argv[0]} (exit {rc}): {last}")


def _write(
    path: str,
    data: bytes,
    uid: int,
    gid: int,
    mode: int | None,
    validate: str | None = None,
    run: Runner | None = None,
) -> None:
    """Replace path with data: a temporary file in the same directory, fsynced, checked by the
    entry's validate command if it has one, renamed over it."""
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(prefix=".corectl-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if uid != -1 or gid != -1:
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), 0o644 if mode is None else mode)
            os.fsync(handle.fileno())
        _validated(path, temporary, validate, run)
        os.rename(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _text(data: bytes | None) -> str | None:
    if data is None or len(data) > DIFF_LIMIT:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def apply_file(entry: dict, check: bool, diffs: list | None, run: Runner | None = None) -> bool:
    path = entry["path"]
    if entry.get("content_b64") is not None:
        data = base64.b64decode(entry["content_b64"])
    elif entry.get("content") is not None:
        data = entry["content"].encode()
    else:
        raise Refused(f"{path}: state file needs content")
    uid, gid = _ids(entry)
    mode = _mode(entry)
    before = None
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            raise Refused(f"{path}: is a directory")
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as handle:
                before = handle.read()
    if before == data:
        return _attributes(path, uid, gid, mode, check)
    if diffs is not None:
        diffs.append(
            {
                "before_header": path,
                "after_header": path,
                "before": _text(before) or ("" if before is None else "(binary or large)\n"),
                "after": _text(data) or "(binary or large)\n",
            }
        )
    if not check:
        if not os.path.isdir(os.path.dirname(path)):
            raise Refused(f"{path}: directory {os.path.dirname(path)} does not exist")
        if before is not None:  # what the entry leaves unsaid stays as the file had it
            st = os.lstat(path)
            uid, gid = (st.st_uid if uid == -1 else uid), (st.st_gid if gid == -1 else gid)
            mode = stat.S_IMODE(st.st_mode) if mode is None else mode
        _write(path, data, uid, gid, mode, entry.get("validate"), run)
    return True


def apply_directory(entry: dict, check: bool, diffs: list | None, run: Runner | None = None) -> bool:
    path = entry["path"]
    uid, gid = _ids(entry)
    mode = _mode(entry)
    if os.path.isdir(path):
        return _attributes(path, uid, gid, mode, check)
    if os.path.lexists(path):
        raise Refused(f"{path}: exists and is not a directory")
    if diffs is not None:
        diffs.append({"before_header": path, "after_header": path, "before": "", "after": "(directory)\n"})
    if not check:
        os.makedirs(path, mode=0o755)
        _attributes(path, uid, gid, mode, check)
    return True


def apply_link(entry: dict, check: bool, diffs: list | None, run: Runner | None = None) -> bool:
    path, target = entry["path"], entry.get("src")
    if not target:
        raise Refused(f"{path}: state link needs src (the target)")
    if os.path.islink(path) and os.readlink(path) == target:
        return False
    if os.path.isdir(path) and not os.path.islink(path):
        raise Refused(f"{path}: is a directory")
    if diffs is not None:
        diffs.append({"before_header": path, "after_header": path, "before": "", "after": f"-> {target}\n"})
    if not check:
        temporary = os.path.join(os.path.dirname(path), f".corectl-link-{os.getpid()}")
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(target, temporary)
        os.rename(temporary, path)
    return True


def apply_absent(entry: dict, check: bool, diffs: list | None, run: Runner | None = None) -> bool:
    path = entry["path"]
    if not os.path.lexists(path):
        return False
    if diffs is not None:
        diffs.append({"before_header": path, "after_header": path, "before": "(present)\n", "after": ""})
    if not check:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return True


APPLY = {"file": apply_file, "directory": apply_directory, "link": apply_link, "absent": apply_absent}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "state": {"type": "str", "choices": list(APPLY), "default": "file"},
                    "content": {"type": "str"},
                    "content_b64": {"type": "str"},
                    "src": {"type": "str"},
                    "owner": {"type": "str"},
                    "group": {"type": "str"},
                    "mode": {"type": "str"},
                    "validate": {"type": "str"},
                },
            },
        },
        supports_check_mode=True,
    )
    diffs: list | None = [] if module._diff else None
    results = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        rc, out, err = module.run_command(argv)
        return rc, out, err

    for entry in module.params["files"]:
        try:
            changed = APPLY[entry["state"]](entry, module.check_mode, diffs, run)
        except (Refused, OSError) as error:
            module.fail_json(msg=str(error), results=results, changed=any(result["changed"] for result in results))
        results.append({"path": entry["path"], "changed": changed})
    changed_paths = [result["path"] for result in results if result["changed"]]
    outcome = {"changed": bool(changed_paths), "results": results, "changed_paths": changed_paths}
    if diffs:
        outcome["diff"] = diffs
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
