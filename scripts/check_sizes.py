#!/usr/bin/python3
"""Checks the house's size rules with universal-ctags.

No function over --max_function lines (150: the hard ceiling; aim for 100)
and no file over --max_file lines (1000) in core/, compression/, outer_opt/,
gossip/ and node/. Generated code lives in the build tree and is not read.
A function's length is ctags' end line minus its first line, plus one, so
it counts its signature, comments inside it and blank lines.

Usage: scripts/check_sizes.py [--max_function=N] [--max_file=N] [--report=N]
  --report=N also lists, without failing, the functions over N lines.
Exits 1 naming every function and file over the limits, 0 when none is.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

MODULES = ['core', 'compression', 'outer_opt', 'gossip', 'node']


def sources(root):
    for module in MODULES:
        for dirpath, _, names in os.walk(os.path.join(root, module)):
            for name in sorted(names):
                if name.endswith(('.cc', '.h')):
                    yield os.path.join(dirpath, name)


def function_lengths(files):
    out = subprocess.run(
        ['ctags', '--output-format=json', '--fields=+ne', '--kinds-c++=f',
         '--language-force=C++', '-f', '-'] + files,
        capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if 'end' not in tag:
            continue
        name = tag['name']
        if tag.get('scope'):
            # Anonymous namespaces show up as __anonXXXX: not a name to read.
            scope = '::'.join(p for p in tag['scope'].split('::')
                              if not p.startswith('__anon'))
            name = f'{scope}::{name}' if scope else name
        yield tag['end'] - tag['line'] + 1, tag['path'], tag['line'], name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--max_function', type=int, default=150)
    parser.add_argument('--max_file', type=int, default=1000)
    parser.add_argument('--report', type=int, default=0)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if shutil.which('ctags') is None:
        print('check_sizes: universal-ctags is not installed '
              '(scripts/setup.sh installs it)', file=sys.stderr)
        return 2
    files = list(sources(root))
    over = []
    for n, path, line, name in sorted(function_lengths(files), reverse=True):
        where = f'{os.path.relpath(path, root)}:{line}'
        if n > args.max_function:
            over.append(f'function {name} ({where}) has {n} lines, '
                        f'over {args.max_function}')
        elif args.report and n > args.report:
            print(f'note: function {name} ({where}) has {n} lines')
    for path in files:
        with open(path, encoding='utf-8') as f:
            n = sum(1 for _ in f)
        if n > args.max_file:
            over.append(f'file {os.path.relpath(path, root)} has {n} lines, '
                        f'over {args.max_file}')
    for line in over:
        print(line)
    print(f'check_sizes: {len(files)} files, '
          f'{len(over)} over the limits', file=sys.stderr)
    return 1 if over else 0


if __name__ == '__main__':
    sys.exit(main())
