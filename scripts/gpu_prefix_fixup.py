#!/usr/bin/env python3
"""Points the pkg-config files and CMake package files of Debian packages unpacked into
a prefix (scripts/gpu-check.sh: dpkg -x into PREFIX) at the prefix: every absolute /usr
path in them whose file or folder exists under PREFIX is rewritten to PREFIX/usr/...;
paths that exist only in the system (libpthread, the compiler's folders) are left alone.

    python3 scripts/gpu_prefix_fixup.py /tmp/echokv-prefix
"""
import os
import re
import sys

# An absolute /usr path at the start of a token (or after -I / -L).
PATH = re.compile(r'(?:(?<=-I)|(?<=-L)|(?<![\w./+-]))(/usr(?:/[\w./+-]*)?)(?![\w+-])')


def fix_text(text, prefix):
    def repl(m):
        path = m.group(1).rstrip('/.')
        if path and os.path.exists(prefix + path):
            return prefix + m.group(1)
        return m.group(1)

    return PATH.sub(repl, text)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    prefix = os.path.abspath(sys.argv[1])
    changed = 0
    for root, _, files in os.walk(os.path.join(prefix, 'usr')):
        for name in files:
            if not (name.endswith('.pc') or name.endswith('.cmake')):
                continue
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            with open(path, encoding='utf-8', errors='surrogateescape') as f:
                text = f.read()
            fixed = fix_text(text, prefix)
            if fixed != text:
                with open(path, 'w', encoding='utf-8', errors='surrogateescape') as f:
                    f.write(fixed)
                changed += 1
    print(f'gpu_prefix_fixup: {changed} .pc / .cmake files pointed at {prefix}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
