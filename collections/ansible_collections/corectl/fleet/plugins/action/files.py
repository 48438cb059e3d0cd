# corectl: the controller side of corectl.fleet.files.
"""Render templates and read role files on the controller, send every path to the node in one
module call, and notify the handlers named by the paths that changed.

An entry takes what the module takes (path, state, content, src, owner, group, mode, validate) and:
  template  a role template (rendered like ansible.builtin.template: same search path, same
            ansible_managed and template_* variables, same defaults), for state file (ignored
            for the other states, so one entry can switch between file and absent);
  vars      extra variables for that template (as a loop's item was);
  src       for state file, a role file (files/), sent as it is;
  notify    a handler name or a list of them, notified when this path changed;
  when      false leaves the entry out (default true).
"""

from __future__ import annotations

import base64
import os

# ansible-core is pinned to 2.19 (pyproject.toml): _template_vars is the helper
# ansible.builtin.template itself uses for ansible_managed and the template_* variables, so a
# template renders here exactly as it does there.
from ansible._internal._templating import _template_vars
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

MODULE_KEYS = ("path", "state", "content", "src", "owner", "group", "mode", "validate")
OWN_KEYS = ("template", "vars", "notify", "when")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp
        entries = self._task.args.get("files")
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise AnsibleActionFail("files: a list of entries (path, state, ...) is required")
        if set(self._task.args) - {"files"}:
            raise AnsibleActionFail(f"unknown options: {', '.join(sorted(set(self._task.args) - {'files'}))}")

        kept, notify = [], []
        for entry in entries:
            unknown = set(entry) - set(MODULE_KEYS) - set(OWN_KEYS)
            if unknown:
                raise AnsibleActionFail(f"{entry.get('path', '?')}: unknown keys {', '.join(sorted(unknown))}")
            if not boolean(entry.get("when", True), strict=True):
                continue
            kept.append(self._module_entry(entry, task_vars))
            handlers = entry.get("notify") or []
            notify.append([handlers] if isinstance(handlers, str) else list(handlers))

        module = self._execute_module(
            module_name="corectl.fleet.files", module_args={"files": kept}, task_vars=task_vars
        )
        # The arguments hold every file's content: keep them out of the result (and so out of
        # the event stream and the run's artefacts).
        module.pop("invocation", None)
        result.update(module)
        changed = [notify[index] for index, item in enumerate(module.get("results", [])) if item.get("changed")]
        names = list(dict.fromkeys(name for handlers in changed for name in handlers))
        if names and result.get("changed"):
            # What ansible.builtin's strategy reads to notify handlers (the key a task's own notify
            # sets); only the changed paths' handlers are in it.
            result["_ansible_notify"] = names
        return result

    def _module_entry(self, entry: dict, task_vars: dict) -> dict:
        state = entry.get("state", "file")
        out = {key: entry[key] for key in MODULE_KEYS if entry.get(key) is not None}
        if state == "file" and entry.get("template") is not None:
            out["content"] = self._render(entry["template"], entry["path"], {**task_vars, **entry.get("vars", {})})
        elif state == "file" and entry.get("src") is not None:
            data = self._read_file(entry["src"])
            out.pop("src")
            try:
                out["content"] = data.decode()
            except UnicodeDecodeError:
                out["content_b64"] = base64.b64encode(data).decode()
        return out

    def _read_file(self, name: str) -> bytes:
        try:
            source = self._find_needle("files", name)
        except AnsibleError as error:
            raise AnsibleActionFail(to_text(error)) from error
        with open(source, "rb") as handle:
            return handle.read()

    def _render(self, name: str, dest: str, task_vars: dict) -> str:
        try:
            source = self._find_needle("templates", name)
        except AnsibleError as error:
            raise AnsibleActionFail(to_text(error)) from error
        data = trust_as_template(self._loader.get_text_file_contents(source))
        searchpath = []
        for path in [*task_vars.get("ansible_search_path", []), self._loader._basedir, os.path.dirname(source)]:
            searchpath += [f"{path}/templates", path]
        variables = task_vars.copy()
        variables.update(
            _template_vars.generate_ansible_template_vars(
                path=name, fullpath=source, dest_path=dest, include_ansible_managed="ansible_managed" not in variables
            )
        )
        templar = self._templar.copy_with_new_env(searchpath=searchpath, available_variables=variables)
        rendered = templar.template(
            data,
            escape_backslashes=False,
            overrides={"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"},
        )
        return "" if rendered is None else rendered
