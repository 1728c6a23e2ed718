#!/usr/bin/env python3
"""The server's layers depend only downward (docs/ARCHITECTURE.md "Layers"):

  main.cc  ->  doors/ (grpc/, http/, auth), metrics  ->  sessions/  ->  engine/  ->  state/

Checked on the #include lines of every file under server/:
  - a file includes server/ headers of its own layer or a lower one only;
  - doors/grpc/ and doors/http/ do not include each other (doors/auth.h is theirs both);
  - no door names the engine's classes (Engine, EnginePort): the doors reach the engine
    only through the session layer (they use engine.h's plain request and reply types).
Exits non-zero with one line per violation.

  tests/docs/layers_test.py [REPO_ROOT]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.path.join(ROOT, "server")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(server/[^"]+)"', re.M)
ENGINE_CLASS = re.compile(r"\b(Engine|EnginePort)\b(?!\w)")
RANK = {"state": 0, "engine": 1, "sessions": 2, "doors": 3, "metrics": 3, "main": 4}


def layer(path):
    """The layer of a path relative to the repository root (server/...)."""
    parts = path.split("/")[1:]
    if parts[0] in ("state", "engine", "sessions", "doors"):
        return parts[0]
    if parts[0].startswith("metrics."):
        return "metrics"
    if parts[0] == "main.cc":
        return "main"
    return None


def door(path):
    parts = path.split("/")
    return parts[2] if len(parts) > 3 and parts[1] == "doors" else None  # grpc | http


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def main():
    bad = []
    files = 0
    for dirpath, _, names in os.walk(SERVER):
        for name in names:
            if not name.endswith((".h", ".cc")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
            own = layer(rel)
            if own is None:
                bad.append(f"{rel}: in no layer (put it under one of {sorted(RANK)})")
                continue
            files += 1
            text = open(os.path.join(dirpath, name), encoding="utf-8").read()
            for inc in INCLUDE.findall(text):
                target = layer(inc)
                if target is None:
                    bad.append(f"{rel}: includes {inc}, which is in no layer")
                elif RANK[target] > RANK[own]:
                    bad.append(f"{rel} ({own}) includes {inc} ({target}): an upward dependency")
                elif door(rel) and door(inc) and door(rel) != door(inc):
                    bad.append(f"{rel} includes {inc}: one door depends on the other")
            if own == "doors":
                for m in ENGINE_CLASS.finditer(strip_comments(text)):
                    bad.append(f"{rel}: names {m.group(1)}: a door calls the session layer, not the engine")
                    break
    for line in bad:
        print(line)
    print(f"{files} files under server/ checked, {len(bad)} violations")
    return 1 if bad or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
