"Install `ddp_safe_fastai` from `settings.ini`, the single source of truth (no `pkg_resources`)"
from configparser import ConfigParser
from pathlib import Path
import setuptools

here = Path(__file__).resolve().parent  # not the working directory: pip and build may run this from elsewhere
cfg = ConfigParser(delimiters=['='])
if not cfg.read(here/'settings.ini', encoding='utf-8'):
    raise FileNotFoundError(f"{here/'settings.ini'} is missing: the sdist must carry it (MANIFEST.in)")
cfg = cfg['DEFAULT']
licenses = {'apache2': 'Apache-2.0'}
statuses = ['Planning', 'Pre-Alpha', 'Alpha', 'Beta', 'Production/Stable', 'Mature', 'Inactive']
min_python = cfg['min_python']
py_versions = [v for v in ['3.10', '3.11', '3.12', '3.13'] if tuple(map(int, v.split('.'))) >= tuple(map(int, min_python.split('.')))]
scripts = [s.strip() for s in cfg.get('console_scripts', '').split('\n') if s.strip()]

setuptools.setup(
    name=cfg['lib_name'], version=cfg['version'], description=cfg['description'],
    long_description=(here/'README.md').read_text(encoding='utf-8'), long_description_content_type='text/markdown',
    author=cfg['author'], author_email=cfg['author_email'], license=licenses[cfg['license']], url=cfg['git_url'],
    license_files=['LICENSE'],
    keywords=cfg['keywords'], packages=setuptools.find_packages(include=[cfg['lib_path'], cfg['lib_path']+'.*']),
    include_package_data=True, zip_safe=False, python_requires='>=' + min_python,
    install_requires=cfg.get('requirements', '').split(),
    extras_require={k: cfg.get(f'{k}_requirements', '').split() for k in ('dev', 's3', 'azure', 'gcs', 'ft')},  # the stores: `[s3]`...; torchft: `[ft]`
    entry_points={'console_scripts': scripts, 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    classifiers=['Topic :: Software Development :: Build Tools', 'Intended Audience :: Developers',
                 f"Development Status :: {cfg['status']} - {statuses[int(cfg['status'])-1]}",
                 'Natural Language :: English']
                + [f'Programming Language :: Python :: {v}' for v in py_versions],
)
