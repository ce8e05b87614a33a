"""Bytecode for every module of a new environment, reusing what the previous one compiled.

Run by the new environment's own interpreter, isolated and without ``site`` (no ``.pth``
file of an installed distribution runs on the host), at the lowest CPU priority:
``python -I -S -c <this file> NEW_SITE [OLD_SITE]``. Prints one JSON object:
``{"reused": n, "compiled": n, "unparsable": n}``.

Workers cannot write bytecode (the environment is read-only to them), so every ``.py`` of
NEW_SITE gets a timestamp pyc in its ``__pycache__``: the invalidation mode CPython checks
with the ``stat`` it makes anyway (a checked hash would read and hash every source at
every import; an unchecked one would serve stale bytecode if a source ever changed).

A pyc of OLD_SITE is linked in instead of compiling when CPython would accept it for the
new source and was compiled from the same bytes: the source at the same path in OLD_SITE
is the same file (uv hard-links both from its cache) or has the same bytes, size and
mtime, and the pyc's header records this interpreter's magic number, timestamp mode and
that mtime and size. Anything else (a changed distribution, a missing or stale pyc, an
OLD_SITE that does not exist) is compiled. Only regular files reached without following a
symbolic link are read in either tree. A source that is not valid Python gets no pyc (as
with pip and uv: importing it fails either way); any other failure (disk full) exits 1.
"""

import concurrent.futures
import ctypes
import importlib.util
import json
import multiprocessing
import os
import py_compile
import shutil
import stat
import struct
import sys
import warnings

# Sources per task handed to a compiler process.
CHUNK = 32


def sources(site):
    """Relative path -> lstat of every regular ``.py`` file below ``site``, and the set of
    relative paths of its regular ``.pyc`` files; no symbolic link is followed."""
    found, pycs = {}, set()
    for root, dirs, files in os.walk(site):
        for name in files:
            if not name.endswith((".py", ".pyc")):
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(path, site)
            if name.endswith(".py"):
                found[rel] = st
            else:
                pycs.add(rel)
    return found, pycs


def header(st):
    """The first 16 bytes of a timestamp pyc CPython accepts for a source with lstat ``st``."""
    return struct.pack(
        "<4sIII",
        importlib.util.MAGIC_NUMBER,
        0,
        int(st.st_mtime) & 0xFFFFFFFF,
        st.st_size & 0xFFFFFFFF,
    )


def same_source(old_path, old, new_path, new):
    if (old.st_dev, old.st_ino) == (new.st_dev, new.st_ino):
        return True
    if old.st_size != new.st_size or int(old.st_mtime) != int(new.st_mtime):
        return False
    with open(old_path, "rb") as a, open(new_path, "rb") as b:
        return a.read() == b.read()


def reusable(old_site, new_site, rel, new, old_sources, old_pycs):
    """The previous environment's pyc for ``rel``, if it is valid for the new source."""
    old = old_sources.get(rel)
    if old is None:
        return None
    pyc_rel = os.path.relpath(
        importlib.util.cache_from_source(os.path.join(old_site, rel)), old_site
    )
    if pyc_rel not in old_pycs:
        return None
    old_path = os.path.join(old_site, rel)
    pyc = os.path.join(old_site, pyc_rel)
    try:
        if not same_source(old_path, old, os.path.join(new_site, rel), new):
            return None
        with open(pyc, "rb") as f:
            if f.read(16) != header(new):
                return None
    except FileNotFoundError:
        return None
    return pyc


def link(pyc, target):
    """``target`` becomes ``pyc`` (a hard link; a copy across file systems)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(pyc, target)
    except OSError:
        shutil.copyfile(pyc, target, follow_symlinks=False)
        shutil.copymode(pyc, target, follow_symlinks=False)


def compile_all(paths):
    """Compiles ``paths``; returns how many are not valid Python (no pyc for those)."""
    unparsable = 0
    for path in paths:
        try:
            py_compile.compile(
                path,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
            )
        except py_compile.PyCompileError:
            unparsable += 1
    return unparsable


def die_with_parent(parent):
    """A compiler process dies with this program (killed at its deadline); it would wait
    for work forever otherwise, as it holds the queue's other end itself."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9)
    if os.getppid() != parent:
        os._exit(1)


def compile_parallel(paths):
    workers = min(len(os.sched_getaffinity(0)), (len(paths) + CHUNK - 1) // CHUNK)
    if workers <= 1:
        return compile_all(paths)
    chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
    # Forked: this program has no file a spawned process could import it from.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
    ) as pool:
        return sum(pool.map(compile_all, chunks))


def main(argv):
    new_site = argv[1]
    old_site = argv[2] if len(argv) > 2 else None
    new_sources, new_pycs = sources(new_site)
    old_sources, old_pycs = sources(old_site) if old_site else ({}, set())
    reused, todo = 0, []
    for rel, new in sorted(new_sources.items()):
        target = importlib.util.cache_from_source(os.path.join(new_site, rel))
        pyc = None
        if os.path.relpath(target, new_site) not in new_pycs:
            pyc = reusable(old_site, new_site, rel, new, old_sources, old_pycs)
        if pyc is None:
            todo.append(os.path.join(new_site, rel))
        else:
            link(pyc, target)
            reused += 1
    unparsable = compile_parallel(todo)
    answer = {"reused": reused, "compiled": len(todo) - unparsable, "unparsable": unparsable}
    print(json.dumps(answer))


if __name__ == "__main__":
    # A source's own warnings (invalid escape sequences) are its authors' business.
    warnings.filterwarnings("ignore")
    main(sys.argv)
