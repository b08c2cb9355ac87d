#!/usr/bin/env bash
# The package as a new user gets it: the sdist and the wheel built from a clean copy of the working tree (the wheel
# from the sdist, as `python -m build` does, so the sdist must hold all that setup.py needs), checked with
# `twine check --strict` and for their contents, then installed into a fresh virtual environment outside the
# repository (the wheel, then the sdist built from source), where `ddp-safe-check --help` and the README's
# "How to use" example run from a directory outside the repository. PKG_DIST=DIR keeps the built files in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
unset PYTHONPATH  # what is installed, not a path set by hand
py=python3
version=$($py -c "import configparser; c=configparser.ConfigParser(delimiters=['=']); c.read('settings.ini'); print(c['DEFAULT']['version'])")
lib=$($py -c "import configparser; c=configparser.ConfigParser(delimiters=['=']); c.read('settings.ini'); print(c['DEFAULT']['lib_name'])")

start=$(date +%s%N); last=$start
phase() {  # phase NAME: what the previous phase took, then NAME
  local now; now=$(date +%s%N)
  [ -n "${current:-}" ] && printf '   (%s: %.1f s)\n' "$current" "$(( (now-last)/1000000 ))e-3"
  current=$1; last=$now
  [ "$1" = done ] || echo "== package: $1"
}

# pip without this machine's warnings about extra index folders that do not exist (pip's status is kept: pipefail)
pip_() { local pip=$1; shift; "$pip" "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2 || true); }

phase "build environment .venv-pkg (build, twine)"
venv=.venv-pkg; pkgs="build twine"
stamp="$venv/.installed-$(echo "$pkgs" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  $py -m venv "$venv"
  pip_ "$venv/bin/pip" install -q -U pip
  pip_ "$venv/bin/pip" install -q $pkgs
  touch "$stamp"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp_safe_fastai-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
case "$tmp/" in "$repo"/*) echo "FAILED: the temporary directory $tmp is inside the repository"; exit 1;; esac
mkdir -p "$tmp/src" "$tmp/dist" "$tmp/work"

phase "sdist and wheel from a clean copy of the working tree (what a clone holds: tracked and not ignored files)"
git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tmp/src"
if ! "$repo/$venv/bin/python" -m build --outdir "$tmp/dist" "$tmp/src" > "$tmp/build.log" 2>&1; then
  tail -40 "$tmp/build.log"; echo "FAILED: python -m build"; exit 1
fi
sdist=$(ls "$tmp"/dist/*.tar.gz); wheel=$(ls "$tmp"/dist/*.whl)
ls -l "$tmp/dist" | tail -n +2
[ -z "${PKG_DIST:-}" ] || { mkdir -p "$PKG_DIST"; cp "$sdist" "$wheel" "$PKG_DIST/"; echo "kept in $PKG_DIST"; }

phase "twine check --strict"
COLUMNS=200 "$venv/bin/twine" --no-color check --strict "$sdist" "$wheel"

phase "contents of the sdist and the wheel"
"$venv/bin/python" - "$sdist" "$wheel" "$tmp/src" "$lib" "$version" <<'EOF'
import sys, tarfile, zipfile, pathlib
sdist, wheel, src, lib, version = sys.argv[1:]
with tarfile.open(sdist) as t: s = {n.split('/', 1)[1] for n in t.getnames() if '/' in n}
with zipfile.ZipFile(wheel) as z: w = set(z.namelist())
print(f'sdist: {len(s)} files'); print(*sorted(s), sep='\n')
bad = []
if not pathlib.Path(sdist).name.startswith(f'{lib}-{version}.') or not pathlib.Path(wheel).name.startswith(f'{lib}-{version}-'):
    bad.append(f'file names do not carry version {version}')
bad += [f'sdist lacks {f}' for f in ['settings.ini', 'LICENSE', 'README.md', 'CHANGELOG.md', 'setup.py', 'pyproject.toml'] if f not in s]
pkg = {str(p.relative_to(src)) for p in pathlib.Path(src, lib).rglob('*.py')}
if not pkg: bad.append(f'no {lib}/*.py in the source copy')
bad += [f'sdist lacks {f}' for f in sorted(pkg - s)]
bad += [f'wheel lacks {f}' for f in sorted(pkg - w)]
sp, wp = {f for f in s if f.startswith(lib + '/')}, {f for f in w if f.startswith(lib + '/')}
if sp != wp: bad.append(f'package files differ: only in the sdist {sorted(sp - wp)}, only in the wheel {sorted(wp - sp)}')
di = f'{lib}-{version}.dist-info/'
bad += [f'wheel lacks {di}{f}' for f in ['licenses/LICENSE', 'entry_points.txt', 'METADATA'] if di + f not in w]
print(f'wheel: {len(wp)} package files, the same as the sdist\'s' if sp == wp else '')
if bad: sys.exit('FAILED:\n  ' + '\n  '.join(bad))
EOF

phase "fresh environment outside the repository: torch==2.13.0 (CPU) and the wheel, its dependencies from the index"
env="$tmp/venv"
$py -m venv "$env"
pip_ "$env/bin/pip" install -q -U pip
(cd "$tmp/work" && pip_ "$env/bin/pip" install -q torch==2.13.0 "$wheel")

# The README's "How to use" examples that run: the code cells of nbs/index.ipynb, which nbconvert renders with a bare
# ``` fence (the fragments of its prose are ```python, and launch commands ```sh). One that trains under DDP runs as
# the README launches it, under torchrun on 2 ranks; one that does not, with python.
"$env/bin/python" - "$repo/README.md" "$tmp/work" <<'EOF'
import sys, re, pathlib
readme, work = sys.argv[1:]
text = pathlib.Path(readme).read_text(encoding='utf-8')
m = re.search(r'^## How to use\n(.*?)(?=^## |\Z)', text, re.S | re.M)
if not m: sys.exit('FAILED: README.md has no "## How to use" section')
blocks = re.findall(r'^```([^\n`]*)\n(.*?)^```', m.group(1), re.S | re.M)
runnable = [code for lang, code in blocks if lang.strip() == '']
if not runnable: sys.exit('FAILED: the "How to use" section of README.md has no runnable example (a bare ``` block)')
with open(f'{work}/examples.txt', 'w') as f:
    for i, code in enumerate(runnable):
        pathlib.Path(work, f'readme_example_{i}.py').write_text(code)
        ddp = re.search(r'distrib_ctx|init_process_group|distrib_learner', code) is not None
        f.write(f"{'torchrun' if ddp else 'python'} readme_example_{i}.py\n")
EOF

check_install() {  # check_install WHAT: the installed package from outside the repository
  cd "$tmp/work"
  "$env/bin/python" - "$env" "$version" "$1" <<'EOF'
import sys, pathlib, ddp_safe_fastai
env, version, what = sys.argv[1:]
f = pathlib.Path(ddp_safe_fastai.__file__).resolve()
assert pathlib.Path(env).resolve() in f.parents, f'{what}: imported {f}, not the installed package'
assert ddp_safe_fastai.__version__ == version, f'{what}: __version__ {ddp_safe_fastai.__version__!r}, settings.ini says {version!r}'
print(f'{what}: {f.parent}, __version__ {ddp_safe_fastai.__version__} as in settings.ini')
EOF
  echo "$ ddp-safe-check --help"
  "$env/bin/ddp-safe-check" --help
  while read -r how file; do
    echo "$ $how $file    # from README.md, \"How to use\":"; sed 's/^/  | /' "$file"
    if [ "$how" = torchrun ]; then
      port=$("$env/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      "$env/bin/torchrun" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" "$file"
    else
      "$env/bin/python" "$file"
    fi
  done < examples.txt
  cd "$repo"
}

phase "the wheel, installed: version, ddp-safe-check --help, the README's example"
check_install wheel

# The sdist into the same environment (its dependencies are the wheel's, already there): pip builds it from source
# in an isolated build environment, with setuptools from the index, as a user's `pip install ...tar.gz` does
phase "the sdist, built from source by pip and installed over the wheel"
(cd "$tmp/work" && pip_ "$env/bin/pip" install -q --force-reinstall --no-deps "$sdist")
"$env/bin/python" - "$env" "$lib" "$version" <<'EOF'
import sys, json, pathlib
env, lib, version = sys.argv[1:]
d = next(pathlib.Path(env).glob(f'lib/python*/site-packages/{lib}-{version}.dist-info'))
url = json.loads((d/'direct_url.json').read_text())['url']
assert url.endswith('.tar.gz'), f'installed from {url}, not the sdist'
assert (d/'licenses'/'LICENSE').exists(), 'the install from the sdist has no LICENSE'
print(f'installed from {url}')
EOF
phase "the sdist, installed: version, ddp-safe-check --help, the README's example"
check_install sdist
phase done
printf 'package: passed in %.1f s\n' "$(( ($(date +%s%N)-start)/1000000 ))e-3"
