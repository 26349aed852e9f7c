"""What the driver quotes from a dead worker's log (no Ray needed: a log file written here)."""

from __future__ import annotations

from pathlib import Path

from queryrl.distributed.worker_group import last_words_of

# the end of a Ray worker's .err file after a segfault, as this suite's CI run left it (addresses shortened)
SEGFAULT_LOG = """:job_id:01000000
:actor_name:PolicyWorker
FutureWarning: `is_gradient_checkpointing` is deprecated
*** SIGSEGV received at time=1795862636 on cpu 1 ***
PC: @     0x7fc709eb6a97  (unknown)  __libc_malloc
    @     0x7fc709e5a050  (unknown)  (unknown)
[2026-11-28 10:43:56,510 E 32259 32466] logging.cc:474: *** SIGSEGV received at time=1795862636 on cpu 1 ***
[2026-11-28 10:43:56,510 E 32259 32466] logging.cc:474: PC: @     0x7fc709eb6a97  (unknown)  __libc_malloc
Fatal Python error: Segmentation fault


Extension modules: msgpack._cmsgpack, torch._C (total: 2)
"""


def test_the_fatal_lines_once_each_without_rays_prefix(tmp_path: Path) -> None:
    log = tmp_path / "worker.err"
    log.write_text(SEGFAULT_LOG, encoding="utf-8")
    assert last_words_of(str(log)) == (
        "*** SIGSEGV received at time=1795862636 on cpu 1 *** | PC: @ 0x7fc709eb6a97 (unknown) __libc_malloc"
        " | Fatal Python error: Segmentation fault"
    )


def test_nothing_to_quote(tmp_path: Path) -> None:
    killed = tmp_path / "killed.err"  # SIGKILL (the OOM killer) leaves no last words
    killed.write_text(":job_id:01000000\n:actor_name:PolicyWorker\n", encoding="utf-8")
    assert last_words_of(str(killed)) == ""
    assert last_words_of(str(tmp_path / "on_another_node.err")) == ""  # not on this machine
    assert last_words_of(None) == ""


def test_only_the_tail_is_read(tmp_path: Path) -> None:
    log = tmp_path / "long.err"
    log.write_text("Fatal Python error: Aborted\n" + "x" * 200 + "\nFatal Python error: Segmentation fault\n")
    assert last_words_of(str(log), tail_bytes=100) == "Fatal Python error: Segmentation fault"
