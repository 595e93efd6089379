"""Copies the .py files of the source package into the build tree (those that changed), so that
PYTHONPATH=BUILD/python imports the package as the sources have it; writes the stamp file."""
import os
import shutil
import sys


def main():
    src, dst, stamp = sys.argv[1:4]
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        rel = os.path.relpath(root, src)
        out = os.path.join(dst, rel) if rel != '.' else dst
        os.makedirs(out, exist_ok=True)
        for name in files:
            if not name.endswith('.py'):
                continue
            a, b = os.path.join(root, name), os.path.join(out, name)
            with open(a, 'rb') as f:
                data = f.read()
            try:
                with open(b, 'rb') as f:
                    same = f.read() == data
            except OSError:
                same = False
            if not same:
                shutil.copyfile(a, b)
    with open(stamp, 'w') as f:
        f.write('')


if __name__ == '__main__':
    main()
