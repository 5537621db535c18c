#!/usr/bin/env python3
"""Checks that #include "..." edges between the project's layers run one way (docs/architecture.md, "Layers").

Every C++/CUDA source under the layer folders belongs to the layer of its folder; each quoted include must name a
file of the project by its path from the repository root (or a sibling in the same folder) and lie in the same
layer or in one the layer may use. Prints every violation and exits 1 when there is one.

  scripts/check_layers.py [ROOT]     check the tree at ROOT (default: this repository)
  scripts/check_layers.py --self-test  check that a hand-made tree with known violations is refused
"""
import os
import re
import sys
import tempfile

# Layer -> the layers it may include (besides itself). Lower layers never include higher ones.
CORE = "lib/core"
ALLOWED = {
    "lib/core": [],
    "lib/api": [CORE],
    "lib/config": [CORE],
    "lib/checkpoint": [CORE, "lib/config"],
    "comm": [CORE],
    "lib/host": [CORE, "lib/api"],
    "client": [CORE, "lib/api", "lib/host"],
    "lib/model/interface": [CORE, "comm"],
    "lib/model": [CORE, "lib/model/interface", "lib/api", "lib/config", "lib/checkpoint", "comm"],
    "kernels/cpu": [CORE, "lib/model/interface"],
    "kernels/cuda": [CORE, "lib/model/interface", "comm"],
    "lib/runtime": [CORE, "lib/model/interface", "lib/api", "lib/config", "lib/checkpoint", "comm", "lib/model"],
    "lib/serve": [CORE, "lib/model/interface", "lib/api", "lib/config", "lib/checkpoint", "comm", "lib/host",
                  "lib/model", "kernels/cpu", "kernels/cuda", "lib/runtime"],
    "lib/bench": [CORE, "lib/model/interface", "lib/api", "lib/config", "lib/checkpoint", "comm", "lib/model",
                  "kernels/cuda", "lib/runtime", "lib/host", "lib/serve", "client"],
}
TOP = ["apps", "tests"]  # may include every layer
# The Backend interface and the weights it is handed: the part of lib/model that kernels/ implements.
INTERFACE_FILES = {"lib/model/backend.hpp", "lib/model/weights.hpp"}
SOURCE_EXT = (".hpp", ".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(rel):
    if rel in INTERFACE_FILES:
        return "lib/model/interface"
    best = None
    for layer in list(ALLOWED) + TOP:
        if rel.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def sources(root):
    for top in ["lib", "comm", "kernels", "client", "apps", "tests"]:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(SOURCE_EXT):
                    full = os.path.join(dirpath, f)
                    yield os.path.relpath(full, root).replace(os.sep, "/")


def check(root):
    problems = []
    for rel in sorted(sources(root)):
        layer = layer_of(rel)
        if layer is None:
            problems.append(f"{rel}: in no layer (add its folder to scripts/check_layers.py)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                sibling = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
                if "/" not in inc and os.path.isfile(os.path.join(root, sibling)):
                    target = sibling  # a header beside the file
                elif os.path.isfile(os.path.join(root, inc)):
                    target = inc
                else:
                    problems.append(f"{rel}:{lineno}: \"{inc}\" is not a path from the repository root")
                    continue
                to = layer_of(target)
                if to is None or layer in TOP or to == layer:
                    continue
                if to in TOP or to not in ALLOWED.get(layer, []):
                    problems.append(f"{rel}:{lineno}: {layer} may not include {target} ({to})")
    return problems


def self_test():
    """A tree with one allowed and three forbidden edges: exactly the three must be reported."""
    with tempfile.TemporaryDirectory() as root:
        files = {
            "lib/core/a.hpp": '#include "lib/core/b.hpp"\n',
            "lib/core/b.hpp": "",
            "lib/core/up.hpp": '#include "lib/model/drafter.hpp"\n',  # core -> model: forbidden
            "lib/model/drafter.hpp": '#include "lib/core/a.hpp"\n#include "lib/model/backend.hpp"\n',
            "lib/model/backend.hpp": '#include "lib/core/a.hpp"\n',
            "comm/x.cpp": '#include "kernels/cuda/k.cuh"\n',  # comm -> kernels: forbidden
            "kernels/cuda/k.cuh": '#include "lib/model/drafter.hpp"\n',  # kernels -> model beyond the interface
            "apps/main.cpp": '#include "kernels/cuda/k.cuh"\n#include "lib/model/drafter.hpp"\n',
        }
        for rel, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as fh:
                fh.write(text)
        found = check(root)
        expected = ["comm/x.cpp:1", "kernels/cuda/k.cuh:1", "lib/core/up.hpp:1"]
        got = sorted(p.split(": ")[0] for p in found)
        if got != expected:
            print("self-test FAILED: expected violations at", expected, "got:", *found, sep="\n  ")
            return 1
    print("self-test PASS: 3 of 3 forbidden includes reported, the allowed ones not")
    return 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    n = sum(1 for _ in sources(root))
    if problems:
        print(f"FAIL: {len(problems)} include(s) against the layer map in {n} files")
        return 1
    print(f"PASS: {n} files, every include from the repository root and within the layer map")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
