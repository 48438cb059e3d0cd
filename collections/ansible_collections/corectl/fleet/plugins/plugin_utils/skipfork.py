# corectl: a task whose `when` is false for a host is skipped in the strategy's process, without a worker.
"""Skip before the fork: a strategy mixin (corectl.fleet.linear and corectl.fleet.mitogen_linear).

Ansible forks one worker process per task and host, and the worker's first real step is the task's
`when`: when it is false, the worker returns ``skipped`` and ends. On a converged node most of a run's
tasks are skipped that way (the roles' fast paths compare once, and the tasks behind them are skipped),
so a no-op forks a worker, pickles its variables and starts a connection context just to learn that.
Measured on the lab (docs/performance.md, "Skipped in the strategy's process"): a skipped task cost the
control host 28 ms a host against 31 for a ``set_fact`` that runs, about half of it the fork.

Here the strategy evaluates the same condition with the same variables the worker would have (the task's
variables, its search path, and the connection's variables from the play context, in the worker's order)
and, when it is false, hands the result queue the very result the worker would have sent, after the same
``v2_runner_on_start`` callback: callbacks, the event stream, ``register`` and the play's statistics see
no difference. Anything else goes to a worker as before: a task with a loop (its `when` is per item),
delegation, a handler, a condition that fails or warns when evaluated, or any error along the way.
``ANSIBLE_CORECTL_SKIP_BEFORE_FORK=0`` turns it off (to compare, or to rule it out).
"""

from __future__ import annotations

import os
from typing import Any

from ansible._internal import _display_utils, _task
from ansible._internal._templating._engine import TemplateEngine
from ansible.executor.task_result import _RawTaskResult
from ansible.playbook.handler import Handler

SWITCH = "ANSIBLE_CORECTL_SKIP_BEFORE_FORK"


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def skipped_result(host: Any, task: Any, task_vars: dict[str, Any], play_context: Any, loader: Any) -> dict | None:
    """The result a worker would return for ``task`` on ``host`` when its condition is false; None when
    the task must go to a worker (a condition that holds, or anything this cannot decide as the worker would)."""
    if not task.when or task.loop_with or task.loop is not None or task.delegate_to or isinstance(task, Handler):
        return None
    try:
        with _task.TaskContext(task), _display_utils.DeferredWarningContext(variables=task_vars) as warnings:
            # what TaskExecutor.run and _execute_internal do before they evaluate the condition
            variables = dict(task_vars)
            search_path = task.get_search_path()
            if loader.get_basedir() not in search_path:
                search_path.append(loader.get_basedir())
            variables["ansible_search_path"] = search_path
            templar = TemplateEngine(loader=loader, variables=variables)
            context = play_context.set_task_and_variable_override(task=task, variables=variables, templar=templar)
            context.post_validate(templar=templar)
            if not context.remote_addr:
                context.remote_addr = host.address
            tempvars = variables.copy()
            context.update_vars(tempvars)
            why: dict[str, Any] = {}
            if task._resolve_conditional(task.when, tempvars, result_context=why):
                return None
            result = dict(changed=False, skipped=True, skip_reason="Conditional result was False") | why
            task.update_result_no_log(templar, result)
            if warnings.get_warnings() or warnings.get_deprecation_warnings():
                return None  # the worker would report them with the result: let it
    except Exception:  # whatever the worker would make of it, it makes it itself
        return None
    return result


class SkipBeforeFork:
    """Mixed in before Ansible's (or Mitogen's) strategy class: ``_queue_task`` answers a false `when`
    itself, as the worker would have, and queues every other task to a worker as before."""

    def _queue_task(self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any) -> None:
        result = skipped_result(host, task, task_vars, play_context, self._loader) if enabled() else None
        if result is None:
            super()._queue_task(host, task, task_vars, play_context)  # type: ignore[misc]
            return
        # what StrategyBase._queue_task and the worker do around the task, in their order
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)
        raw = _RawTaskResult(host=host, task=task, return_data=result, task_fields=task.dump_attrs())
        self._final_q.send_task_result(raw)
        self._pending_results += 1
