#!/usr/bin/python3
"""Reference renderer for the differential tests: Jinja2 configured as transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, the loopcontrols extension, tojson = json.dumps(ensure_ascii=False,
indent, separators, sort_keys), raise_exception(msg), strftime_now(fmt) with a fixed
"now").

Reads {"cases": [{"template": str, "vars": {...}, "now": "YYYY-MM-DDTHH:MM:SS"}]}
from stdin (JSON; objects keep their order) and writes one result per case:
{"ok": true, "out": str} or {"ok": false, "raised": bool, "error": str}; in "out",
" at 0x..." is removed from reprs such as "<generator object ... at 0x...>".
Run with Debian's /usr/bin/python3 and python3-jinja2.
"""
import datetime
import json
import re
import sys

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


ADDRESS = re.compile(r" at 0x[0-9a-f]+>")


class Raised(TemplateError):
    """raise_exception(msg) from the template."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def make_env(now):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


class Clock:
    """strftime_now's "now", set per case (the compiled templates are shared)."""
    now = datetime.datetime(2026, 12, 1, 9, 30)


ENV = make_env(None)
ENV.globals["strftime_now"] = lambda fmt: Clock.now.strftime(fmt)
COMPILED = {}


def compile_template(source):
    if source not in COMPILED:
        COMPILED[source] = ENV.from_string(source)
    return COMPILED[source]


def render(case):
    Clock.now = datetime.datetime.fromisoformat(case.get("now", "2026-12-01T09:30:00"))
    try:
        out = compile_template(case["template"]).render(**case.get("vars", {}))
        # Reprs of iterators and methods carry a memory address ("<generator object
        # do_items at 0x7f...>"): drop it so the rest can be compared.
        return {"ok": True, "out": ADDRESS.sub(">", out)}
    except Raised as e:
        return {"ok": False, "raised": True, "error": str(e)}
    except RecursionError as e:
        return {"ok": False, "raised": False, "error": "RecursionError: " + str(e)}
    except Exception as e:  # any Jinja or Python error counts as "an error"
        return {"ok": False, "raised": False, "error": type(e).__name__ + ": " + str(e)}


def main():
    request = json.load(sys.stdin)
    results = [render(c) for c in request["cases"]]
    json.dump({"jinja2_version": jinja2.__version__, "results": results}, sys.stdout,
              ensure_ascii=False)


if __name__ == "__main__":
    main()
