"""Letting go of a broken process group without waiting for it.

A gloo group whose generation broke may have threads inside collectives that return only
at their timeout, and its destructor joins them. The training thread must never wait for
that, and the process must not exit while such a group is still alive (its transport
threads would run on while the interpreter is torn down under them). So a broken group is
unregistered at once and its last reference dropped on a release thread later, and exit
waits for those threads.
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

__all__ = ["abandon_default_group", "drop_later", "wait_for_releases"]


def abandon_default_group(release_after: float) -> None:
    """Forget the broken default process group without waiting for it to shut down.

    Shutting a gloo group down joins its worker threads, and a thread still inside a
    collective of the broken generation returns only at the collective's timeout. When two
    survivors are each blocked so (each in a collective the other will never enter), both
    wait the full ``--timeout`` before they can form the next generation. So the group is
    unregistered at once and its last reference dropped on a helper thread once its
    collectives have timed out: nobody waits for it.
    """
    c10d = dist.distributed_c10d
    group = c10d.GroupMember.WORLD
    if group is None:
        return
    world = c10d._world
    c10d._update_default_pg(None)
    for table in (
        world.pg_map,
        world.pg_names,
        world.pg_group_ranks,
        world.pg_backend_config,
        world.pg_to_tag,
        world.tags_to_pg,
        world.pg_coalesce_state,
    ):
        table.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0
    drop_later(group, after=release_after)


#: Release threads not yet done, and when each will be (monotonic clock).
_releases: list[tuple[threading.Thread, float]] = []


def drop_later(*objects: object, after: float) -> None:
    """Drop the last references to ``objects`` on a helper thread ``after`` seconds from
    now, so that their destructors (which may wait on a broken collective) never block
    the training thread. Hand over the only references."""
    held = list(objects)

    def release() -> None:
        time.sleep(after)
        held.clear()  # the destructors run here

    thread = threading.Thread(target=release, name="tidal-release", daemon=True)
    thread.start()
    _releases.append((thread, time.monotonic() + after))


def wait_for_releases(grace: float = 5.0) -> None:
    """Wait until every object handed to :func:`drop_later` is gone (at most ``grace``
    seconds past the latest release time).

    Called before the process exits: a broken process group still alive at interpreter
    shutdown keeps its transport threads running while the runtime is torn down under
    them, and a peer closing its end then kills this process (SIGSEGV or SIGABRT) after
    the job has finished, which would read as a failure."""
    while _releases:
        thread, due = _releases.pop()
        thread.join(timeout=max(0.0, due - time.monotonic()) + grace)
