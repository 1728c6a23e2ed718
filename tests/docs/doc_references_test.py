#!/usr/bin/python3
"""Every document a comment or a doc cites is in the repository.

Scans the sources, scripts, CMake files, protos and docs of the tree for citations of
project documents and fails, naming file and line, when one points at a file that is not
in the repository:

- a path `docs/NAME.md` (or `docs/sub/NAME.md`) that does not exist;
- the bare name of a design note (ALGORITHM, ENGINE, SESSION_MEMORY, DESIGN or GPU, with
  `.md`) without `docs/` (the notes outside the repository carry the same names), and any
  path into the shared notes folder or the paper folder beside the checkout;
- a section `docs/ALGORITHM.md §N` / `§N.M` / `§N step K` or `docs/SESSION_MEMORY.md §N`
  that the document does not have (a `## N.` heading; for `§N.M`, item M of the numbered
  list under `## N.`);
- a quoted section `docs/ENGINE.md "Name"` that is not one of its `## ` headings;
- a path of the tree's own sources (`server/engine/engine.h`, `tests/model/x_test.cc`, ...)
  that exists neither from the repository root nor from the citing file's folder or one
  above it (generated `*.pb.h` files and the journal of old measurements excepted): a
  comment must not point at a file that was moved or deleted.

    /usr/bin/python3 tests/docs/doc_references_test.py REPO_ROOT     # ctest docs_references_test
"""

import os
import re
import sys

EXTENSIONS = (".h", ".cc", ".py", ".sh", ".md", ".txt", ".cmake", ".proto", ".yaml")
# Not the repository's own text: build trees and .cache (the default model, the CUDA
# build's torch wheel with its own docs/ citations; scripts/setup.sh puts them there) and
# .venv-kvpress (tools/kvpress_venv.sh: PyPI packages citing their own docs/).
SKIP_DIRS = {".git", ".cache", ".venv-kvpress", "build", "build-asan", "build-fuzz", "third_party"}
BARE = re.compile(r"(?<![\w/.-])(ALGORITHM|ENGINE|SESSION_MEMORY|DESIGN|GPU)\.md")
# (Spelled in pieces, so that a grep of the tree for those paths finds only real citations.)
OUTSIDE = re.compile("shared" + r"/docs/|\.\." + "/paper")
DOC_PATH = re.compile(r"(?<![\w/.-])docs/([\w/.-]+?\.md)")
# docs/ALGORITHM.md §3, §8.5, §3 step 2, §4-§5, §4–§5, §2, §4, §8
SECTIONS = re.compile(r"docs/(ALGORITHM|SESSION_MEMORY)\.md((?:[ ,/]*(?:and )?§\d+(?:\.\d+)?(?: step \d+)?(?:\s*[-–]\s*§\d+(?:\.\d+)?)?)+)")
SECTION = re.compile(r"§(\d+)(?:\.(\d+))?(?: step (\d+))?")
QUOTED = re.compile(r'docs/ENGINE\.md,? "([^"]+)"')
SOURCE_PATH = re.compile(r"(?<![\w/.\-$])((?:server|model|kernels|compression|common|bench|tools|tests|client|deploy|"
                         r"scripts|jinja|proto)/[A-Za-z0-9_/.\-]+\.(?:h|cc|py|sh|proto|cu|cuh))\b")
JOURNAL = os.path.join("docs", "benchmarks", "JOURNAL.md")  # a record of the past: old paths stay


def source_exists(root, citing, cited):
    """`cited` from the root, or from the citing file's folder or any folder above it."""
    d = os.path.dirname(citing)
    while True:
        if os.path.exists(os.path.join(d, cited)):
            return True
        if os.path.abspath(d) == os.path.abspath(root) or not d:
            return os.path.exists(os.path.join(root, cited))
        d = os.path.dirname(d)


def sections_of(path):
    """{N: set of list items M} of a document's numbered `## N.` sections, and its headings."""
    numbered, headings, current = {}, set(), None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"## (\d+)\.", line)
            if line.startswith("## "):
                headings.add(line[3:].strip())
                current = int(m.group(1)) if m else None
                if current is not None:
                    numbered[current] = set()
                continue
            item = re.match(r"(\d+)\. ", line)
            if current is not None and item:
                numbered[current].add(int(item.group(1)))
    return numbered, headings


def files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for name in filenames:
            if name.endswith(EXTENSIONS):
                yield os.path.join(dirpath, name)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    docs = {name: sections_of(os.path.join(root, "docs", name + ".md"))
            for name in ("ALGORITHM", "SESSION_MEMORY", "ENGINE")
            if os.path.exists(os.path.join(root, "docs", name + ".md"))}
    this = os.path.abspath(__file__)
    errors = []
    checked = 0
    sources = 0
    for path in files(root):
        if os.path.abspath(path) == this:
            continue
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        for no, line in enumerate(lines, 1):
            where = f"{rel}:{no}"
            for m in BARE.finditer(line):
                errors.append(f"{where}: '{m.group(0)}' without docs/ (the notes outside the repository have that name)")
            for m in OUTSIDE.finditer(line):
                errors.append(f"{where}: '{m.group(0)}' is outside the repository")
            for m in DOC_PATH.finditer(line):
                checked += 1
                if not os.path.exists(os.path.join(root, "docs", m.group(1))):
                    errors.append(f"{where}: docs/{m.group(1)} does not exist")
            for m in SECTIONS.finditer(line):
                numbered = docs.get(m.group(1), ({}, set()))[0]
                for s in SECTION.finditer(m.group(2)):
                    n, item = int(s.group(1)), s.group(2)
                    if n not in numbered:
                        errors.append(f"{where}: docs/{m.group(1)}.md has no section {n} ({s.group(0)})")
                    elif item is not None and int(item) not in numbered[n]:
                        errors.append(f"{where}: docs/{m.group(1)}.md §{n} has no item {item}")
            for m in QUOTED.finditer(line):
                if "ENGINE" in docs and m.group(1) not in docs["ENGINE"][1]:
                    errors.append(f'{where}: docs/ENGINE.md has no section "{m.group(1)}"')
            if rel != JOURNAL:
                for m in SOURCE_PATH.finditer(line):
                    if m.group(1).endswith(".pb.h"):
                        continue  # generated in the build tree
                    sources += 1
                    if not source_exists(root, path, m.group(1)):
                        errors.append(f"{where}: {m.group(1)} does not exist")
    for e in errors:
        print(e)
    if checked == 0:
        print(f"no docs/*.md citation found under {root}: wrong root?")
        return 1
    print(f"{checked} citations of docs/*.md and {sources} of source files checked, {len(errors)} bad")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
