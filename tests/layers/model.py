"""A reference model of a workspace's stack, and a seeded random walk that drives a real layer
driver and the model side by side (``test_model.py`` runs a few seeds, ``bench/layers_model.py``
many).

The model states the rules in a few lines, independent of either driver:

- a task starts from the workspace's view, each file its own copy (hard links do not reach
  into a task's view); inside the task, hard links share content;
- a task's layer holds exactly the paths whose final state differs from its start (content,
  permission bits, link target, kind); a path gone is a deletion. Touching a file, writing the
  same bytes, removing and remaking it or a directory with the same content is no change;
- the view is the base with the layers of applied tasks laid over it, oldest first: a deletion
  removes the path and what is under it, a file or link replaces it, a directory replaces a
  non-directory and merges with a directory;
- undo removes one task's layer from the stack; a failed task's layer is never applied;
- tasks that overlap each start from the view as it was at their start; each one's layer is laid
  on the stack when it ends, so the last to end wins where both changed a path.

The walk drives the drivers without the database or the janitor: each layer is sealed as its
task ends, before anything starts over it, so every start stacks every applied layer. Which
layers a start may leave out (one still sealing, of a task that finished after the new task was
created: ``stack_record.record_layer``) is the stack record's rule, tested in
``test_concurrent_starts.py``; it does not touch what is checked here, so the walk stays
deterministic.
"""
from __future__ import annotations

import os
import random
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tasks.layers.base import get_driver
from tasks.layers.driver import Root
from tasks.layers.stack import DIR, Stack
from tasks.layers.tree import LINK, LayerTree, Meta

NAMES = ["a", "b", "c d", "caf\udce9", "é"]
DIRS = ["d", "e"]
CONTENTS = [b"", b"one\n", b"two\n", b"six\n", b"\x00\x01b\n", b"one\none\n"]  # mostly one size: renames that keep size

Node = tuple  # ("d",) | ("f", bytes, mode) | ("l", target)
Tree = dict[str, Node]


@dataclass
class Inode:
    data: bytes
    mode: int = 0o644


@dataclass
class Working:
    """A task's view in the model: paths to inodes, so hard links share writes."""

    entries: dict[str, Inode | str | None] = field(default_factory=dict)  # None: a directory; str: a link target

    @classmethod
    def of(cls, tree: Tree) -> Working:
        working = cls()
        for path, node in tree.items():
            if node[0] == "d":
                working.entries[path] = None
            elif node[0] == "f":
                working.entries[path] = Inode(node[1], node[2])
            else:
                working.entries[path] = node[1]
        return working

    def tree(self) -> Tree:
        result: Tree = {}
        for path, value in self.entries.items():
            if value is None:
                result[path] = ("d",)
            elif isinstance(value, Inode):
                result[path] = ("f", value.data, value.mode)
            else:
                result[path] = ("l", value)
        return result

    def remove(self, path: str) -> None:
        for other in [p for p in self.entries if p == path or p.startswith(path + "/")]:
            del self.entries[other]


@dataclass
class Started:
    """A task whose view is open: the model's start and working view, the real root."""

    start: Tree
    working: Working
    root: Root
    ops: list[str] = field(default_factory=list)


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def layer_of(start: Tree, end: Tree) -> Tree:
    """The paths whose final state differs from the start; ("w",) marks a deletion."""
    layer: Tree = {}
    for path, node in end.items():
        before = start.get(path)
        if before != node and not (node[0] == "d" and before is not None and before[0] == "d"):
            layer[path] = node
    for path in start:
        if path not in end and parent(path) in end | {"": ("d",)} and end.get(parent(path), ("d",))[0] == "d":
            layer[path] = ("w",)
    return layer


def lay(view: Tree, layer: Tree) -> Tree:
    """``layer`` over ``view``. A layer holds the directories above each of its entries (as an
    overlay upper directory does), so they exist in the view whatever is undone beneath."""
    result = dict(view)

    def put(path: str, node: Node) -> None:
        current = result.get(path)
        if node[0] == "d" and current is not None and current[0] == "d":
            return
        for other in [p for p in result if p == path or p.startswith(path + "/")]:
            del result[other]
        if node[0] != "w":
            result[path] = node

    for path in sorted(layer, key=lambda p: p.count("/")):
        above = parent(path)
        ancestors = []
        while above:
            ancestors.append(above)
            above = parent(above)
        for ancestor in reversed(ancestors):
            put(ancestor, ("d",))
        put(path, layer[path])
    return result


# --- the real side ---------------------------------------------------------------------------

def read_stack(stack: Stack) -> Tree:
    result: Tree = {}

    def visit(rel: str) -> None:
        for name, found in stack.listdir(rel).items():
            path = f"{rel}/{name}" if rel else name
            if found.kind == DIR:
                result[path] = ("d",)
                visit(path)
            elif found.kind == LINK:
                assert found.path is not None
                result[path] = ("l", os.readlink(found.path))
            else:
                assert found.path is not None
                result[path] = ("f", found.path.read_bytes(), stat.S_IMODE(os.lstat(found.path).st_mode))

    visit("")
    return result


def read_dir(root: Path) -> Tree:
    result: Tree = {}
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        for name in dirs + files:
            path = name if rel == "." else f"{rel}/{name}"
            full = Path(directory) / name
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                result[path] = ("l", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                result[path] = ("d",)
            else:
                result[path] = ("f", full.read_bytes(), stat.S_IMODE(st.st_mode))
    return result


class Workspace:
    """A base directory plus sealed layers, driven through one driver without the database."""

    def __init__(self, driver: str, data: Path) -> None:
        self.driver = get_driver(driver)
        self.data = data
        self.base = data / "base"
        self.base.mkdir(parents=True)
        self.applied: list[Path] = []  # oldest first
        self.count = 0

    def lowers(self) -> list[LayerTree]:
        return [LayerTree.of_layer(d) for d in reversed(self.applied)] + [LayerTree(self.base, plain=True)]

    def root(self) -> Root:
        self.count += 1
        name = f"t{self.count}"
        layer = self.data / "layers" / name
        layer.mkdir(parents=True)
        return Root("", self.lowers(), layer / "upper", layer / "ovl-work", self.data / "tasks" / name / "view",
                    layer / "manifest.json", self.data / "mounts" / name, layer)

    def seal(self, root: Root) -> Path:
        directory = root.upper.parent
        meta = Meta.load(directory)
        self.driver.seal(root, meta)
        meta.driver, meta.format, meta.sealed = self.driver.name, self.driver.markers, True
        meta.save(directory)
        shutil.rmtree(root.view.parent, ignore_errors=True)
        return directory

    def view(self) -> Tree:
        return read_stack(Stack(self.lowers()))

    def opened_view(self) -> Tree:
        """What a new task's processes would see (a real mount or a real copy)."""
        root = self.root()
        self.driver.open(root)
        try:
            return read_dir(root.view)
        finally:
            shutil.rmtree(self.seal(root))


# --- the walk --------------------------------------------------------------------------------

class Walk:
    """One seeded sequence of tasks, each a few random operations, applied to a real view and
    to the model; checked after every task and every undo."""

    def __init__(self, driver: str, data: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.real = Workspace(driver, data)
        self.base: Tree = {}
        self.layers: list[Tree] = []  # the model's applied layers, oldest first
        self.log: list[str] = []

    def model_view(self) -> Tree:
        view = dict(self.base)
        for layer in self.layers:
            view = lay(view, layer)
        return view

    def run(self, tasks: int) -> None:
        for _ in range(tasks):
            roll = self.rng.random()
            if self.layers and roll < 0.25:
                index = self.rng.randrange(len(self.layers))
                self.log.append(f"undo #{index}")
                del self.layers[index]
                shutil.rmtree(self.real.applied.pop(index))
            elif roll < 0.4:
                self.overlapping()
            else:
                self.task()
            self.check()
        assert self.real.opened_view() == self.model_view(), self.explain("a new task's view")

    def check(self) -> None:
        assert self.real.view() == self.model_view(), self.explain("the workspace view")

    def explain(self, what: str) -> str:
        real, model = self.real.view(), self.model_view()
        wrong = sorted(set(real) ^ set(model) | {p for p in real if p in model and real[p] != model[p]})
        return f"{what} differs from the model at {wrong[:5]}; history:\n  " + "\n  ".join(self.log)

    def begin(self) -> Started:
        start = self.model_view()
        root = self.real.root()
        self.real.driver.open(root)
        return Started(start, Working.of(start), root)

    def end(self, task: Started, name: str) -> None:
        failed = self.rng.random() < 0.15
        self.log.append(f"{name}{' (failed)' if failed else ''}: " + "; ".join(op for op in task.ops if op))
        directory = self.real.seal(task.root)
        if failed:
            shutil.rmtree(directory)
            return
        self.real.applied.append(directory)
        self.layers.append(layer_of(task.start, task.working.tree()))

    def task(self) -> None:
        task = self.begin()
        task.ops = [self.operation(task.working, task.root.view) for _ in range(self.rng.randint(1, 6))]
        self.end(task, "task")

    def overlapping(self) -> None:
        """Two tasks open on the same view at once, their operations interleaved; they end in
        either order, and the one that ends last is on top (the last writer wins)."""
        first, second = self.begin(), self.begin()
        for _ in range(self.rng.randint(2, 8)):
            task = self.rng.choice((first, second))
            task.ops.append(self.operation(task.working, task.root.view))
        order = [("first", first), ("second", second)]
        if self.rng.random() < 0.5:
            order.reverse()
        for name, task in order:
            self.end(task, f"overlapping task, {name} to start, ends")

    def pick(self, working: Working, kind: str | None) -> str | None:
        paths = sorted(p for p, v in working.entries.items()
                       if kind is None or (kind == "d") == (v is None) and (kind != "f" or isinstance(v, Inode)))
        return self.rng.choice(paths) if paths else None

    def new_path(self, working: Working) -> str | None:
        dirs = [""] + sorted(p for p, v in working.entries.items() if v is None)
        where = self.rng.choice(dirs)
        name = self.rng.choice(NAMES + DIRS)
        path = f"{where}/{name}" if where else name
        return None if path in working.entries else path

    def operation(self, w: Working, view: Path) -> str:
        """One random operation, done on the real view and the model. Returns what it did."""
        rng = self.rng
        choice = rng.choice(["write", "write", "replace", "touch", "same", "delete", "rename", "mkdir",
                             "remake", "link", "hardlink", "chmod", "rmfile_recreate"])
        if choice in ("write", "same", "touch", "chmod", "rmfile_recreate", "hardlink", "replace"):
            path = self.pick(w, "f")
            if path is None or choice == "write" and rng.random() < 0.4:
                path = self.new_path(w)
                if path is None:
                    return ""
                data = rng.choice(CONTENTS)
                (view / path).write_bytes(data)
                os.chmod(view / path, 0o644)
                w.entries[path] = Inode(data)
                return f"create {path!r}"
            inode = w.entries[path]
            assert isinstance(inode, Inode)
            real = view / path
            if choice == "write":
                data = rng.choice(CONTENTS)
                with open(real, "r+b") as handle:  # in place: a hard link sees it too
                    handle.truncate(0)
                    handle.write(data)
                inode.data = data
                return f"write {path!r}"
            if choice == "same":
                real.write_bytes(inode.data)
                return f"rewrite same {path!r}"
            if choice == "touch":
                os.utime(real, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
                return f"touch {path!r}"
            if choice == "chmod":
                inode.mode = 0o755 if inode.mode == 0o644 else 0o644
                os.chmod(real, inode.mode)
                return f"chmod {path!r}"
            if choice == "rmfile_recreate":
                data = inode.data if rng.random() < 0.6 else rng.choice(CONTENTS)
                real.unlink()
                real.write_bytes(data)
                os.chmod(real, inode.mode)
                w.entries[path] = Inode(data, inode.mode)
                return f"rm and recreate {path!r}"
            if choice == "replace":
                data = rng.choice(CONTENTS)
                tmp = real.with_name(".tmp-model")
                tmp.write_bytes(data)
                os.chmod(tmp, 0o644)
                os.replace(tmp, real)
                w.entries[path] = Inode(data)
                return f"replace {path!r}"
            target = self.new_path(w)
            if target is None:
                return ""
            os.link(real, view / target)
            w.entries[target] = inode
            return f"ln {path!r} {target!r}"
        if choice == "delete":
            path = self.pick(w, None)
            if path is None:
                return ""
            real = view / path
            if real.is_dir() and not real.is_symlink():
                shutil.rmtree(real)
            else:
                real.unlink()
            w.remove(path)
            return f"rm -rf {path!r}"
        if choice == "rename":
            source = self.pick(w, "f")
            if source is None:
                return ""
            files = [p for p, v in w.entries.items() if isinstance(v, Inode) and p != source]
            target = rng.choice(files) if files and rng.random() < 0.6 else self.new_path(w)
            if target is None or w.entries.get(target) is w.entries[source]:
                return ""  # rename(2) between two links of one file does nothing
            if os.path.lexists(view / target):  # the mover has the target's mtime, as files from one archive
                st = os.lstat(view / target)
                os.utime(view / source, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(view / source, view / target)
            w.entries[target] = w.entries.pop(source)
            return f"mv -f {source!r} {target!r}"
        if choice == "mkdir":
            path = self.new_path(w)
            if path is None:
                return ""
            (view / path).mkdir()
            w.entries[path] = None
            return f"mkdir {path!r}"
        if choice == "remake":
            path = self.pick(w, "d")
            if path is None:
                return ""
            shutil.rmtree(view / path)
            (view / path).mkdir()
            w.remove(path)
            w.entries[path] = None
            return f"rm -rf {path!r} && mkdir {path!r}"
        path = self.new_path(w)
        if path is None:
            return ""
        target = rng.choice(["a", "../x", "/etc/passwd"])
        os.symlink(target, view / path)
        w.entries[path] = target
        return f"ln -s {target!r} {path!r}"
