"""`safe_unpickle` (nbs/15_safe_unpickle.ipynb) and `load_learner`'s default (nbs/41_learner.ipynb): real exports of the
five applications load and predict what their exporter predicted; malicious exports are refused, naming their global,
and their payloads never run"""
import io, os, re, sys, json, time, types, shutil, pickle, zipfile, subprocess, operator, importlib, collections
from pathlib import Path
import pytest, torch, cloudpickle
from fasttransform.transform import Transform
from ddp_safe_fastai.all import load_learner, UnsafeExportError
from ddp_safe_fastai.safe_unpickle import admitted_by, export_policy, export_uses, pickle_of, export_report
from conftest import values, ranks

HERE = Path(__file__).parent
TOOLS = HERE.parent/'tools'  # the corpus's tools: `export_corpus.py` makes it, `load_corpus.py` loads it as a user's script
pytestmark = pytest.mark.xdist_group('safe_load')  # one corpus, made once

@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    "The exports of `tools/export_corpus.py`, made by a process of their own, and what it predicted"
    out = tmp_path_factory.mktemp('corpus')
    r = subprocess.run([sys.executable, TOOLS/'export_corpus.py', out], capture_output=True, text=True, timeout=1500, cwd=out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, json.loads((out/'corpus.json').read_text())

def exports_globals(files):
    "Every global the pickles of `files` name, as (module, name), read with pickletools: nothing run"
    return {k for f in files for k in export_uses(pickle_of(f))[0]}

VISION = {'vision_name_func', 'vision_lambda', 'vision_folders', 'vision_xresnet', 'segmentation', 'keypoints', 'metric_f1_precision',
          'loss_label_smoothing', 'loss_focal', 'callback_mixed_precision', 'callback_gradient_accumulation', 'arch_densenet',
          'arch_xresnet_mish', 'torch_sequential', 'opt_sgd', 'opt_ranger', 'opt_qhadam', 'block_name_re', 'block_multi_category',
          'block_regression', 'block_bbox', 'layer_weight_norm', 'layer_spectral_norm', 'layer_simple_self_attention', 'arch_xresnet_self_attention',
          'loss_dice', 'split_default', 'callback_channels_last', 'segmentation_self_attention'}

TABLES = {'tabular', 'tabular_regression', 'collab', 'collab_nn', 'collab_metrics', 'text', 'tabular_roc_auc', 'tabular_matthews', 'tabular_loss_weighted',
          'tabular_loss_focal', 'tabular_callbacks', 'tabular_opt_rmsprop', 'tabular_opt_lamb', 'tabular_opt_radam', 'tabular_opt_adam_wd', 'tabular_opt_sgd_momentum',
          'tabular_regression_metrics', 'tabular_user_module', 'tabular_user_main', 'text_lm'}
USERS = {'tabular_user_module': 'allow=[corpus_models.TinyTabular]', 'tabular_user_main': 'define a class MainTabular in the loading script'}

@pytest.mark.parametrize('mode', ['define', 'none'])
def test_corpus_loads_and_predicts(corpus, mode):
    "Each export of the corpus, loaded by default in a script of its own (defining the exporter's functions in `__main__`, or none): the exporter's prediction; the DataLoaders load too; with the functions defined, given those DataLoaders, it fine-tunes"
    out,made = corpus
    r = subprocess.run([sys.executable, TOOLS/'load_corpus.py', out, mode], capture_output=True, text=True, timeout=1500, cwd=out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    loaded = json.loads((out/f'loaded-{mode}.json').read_text())
    assert set(loaded) == (VISION if made['vision'] else set()) | TABLES
    assert len(loaded) >= (49 if made['vision'] else 20), len(loaded)  # the dev stack has no torchvision: its tables, collab and text
    for name,res in loaded.items():
        if mode == 'none' and name in USERS:  # the user's own classes: refused, saying how to admit them
            assert 'UnsafeExportError' in res['error'] and USERS[name] in res['error'] and '_make_skeleton_class' not in res['error'], (name, res)
            continue
        assert 'error' not in res, (name, res)
        assert res['predicted'] == made['made'][name], (name, res['predicted'], made['made'][name])
        if mode == 'define': assert res.get('trained') or name in ('block_bbox', 'vision_lambda', 'keypoints'), (name, res)
        else: assert res['inspected'] == [True, True], (name, res)  # `ddp-safe-check inspect` admits what the load admits
    if made['vision']:
        assert loaded['vision_folders']['label'] == '3'  # fastai's `parent_label`: admitted
        # the exporter's label function, carried as code: the loading script's own where it defines one, else a stand-in
        assert loaded['vision_name_func']['label'] == '3' if mode == 'define' else 'label_func carried as code' in loaded['vision_name_func']['label']
        assert 'lambda' in loaded['vision_lambda']['label'] and 'UnsafeExportError' in loaded['vision_lambda']['label']

def test_policy_is_the_corpus(corpus):
    "Every global the corpus names is admitted, by the policy or its rule, or is the user's own (`__main__`, `corpus_models`), or is what a transform's dispatch table and signature are made of (read as data where a transform holds them, never built); every entry resolves to a class or function"
    from ddp_safe_fastai.safe_unpickle import READ_AS_DATA
    from ddp_safe_fastai.unpickle_policy import POLICY_RULE
    POLICY_RULE.import_libraries()  # what every load imports first
    out,made = corpus
    named = exports_globals(sorted(out.glob('*.pkl')))
    policy = export_policy()
    assert {(m, n) for m,n in named if m not in ('__main__', 'corpus_models') and admitted_by(policy, m, n) is None} - READ_AS_DATA == set()  # but the user's own
    for (m,n),a in policy.items():
        if a.kind == 'bound' or not importlib.util.find_spec(m.split('.')[0]): continue
        try: obj = importlib.import_module(m)
        except Exception: continue  # a module of the other stack (fastcore 1 or 2), or torchvision beside the dev stack's torch
        for part in n.split('.'): obj = getattr(obj, part, None)
        assert obj is None or callable(obj) or obj is Ellipsis, (m, n)  # `...`, in a type annotation

def test_every_policy_line_is_read_whole():
    "Each `call` line of the policy names its arguments in words the check knows, and what it makes; a word it does not know fails here, not in a user's load"
    from ddp_safe_fastai.safe_unpickle import known_word
    calls = {k: a for k,a in export_policy().items() if a.kind == 'call'}
    assert len(calls) >= 30, len(calls)
    for k,a in calls.items():
        assert a.result, k
        for w in a.args: assert known_word(w.rstrip('?*')), (k, w)
    assert not known_word('anything') and known_word('int|none')

def inspect_refuses(file, error):
    "Does `ddp-safe-check inspect` refuse `file` with the reason the load's `error` gives?"
    report,admitted = export_report(file)
    return not admitted and str(error).endswith(report.split('the default load refuses it (in a program that defines no function or class of its own): ', 1)[-1])

# --- malicious exports: a real Learner's export carrying a payload, refused before any of it runs
class Reduce:
    "What a malicious export carries: an object whose pickle calls `func(*args)` as it loads (`__reduce__`)"
    def __init__(self, func, *args): self.func,self.args = func,args
    def __reduce__(self): return self.func, self.args
    def __call__(self, *args): pass  # pickle writes only callables as a reduce's function

def carried(name, source):
    "A function pickled by value (cloudpickle carries `__main__`'s so), whose body is `source`"
    f = types.FunctionType(compile(source, '<payload>', 'exec').co_consts[0], {'os': os, 'open': open})
    f.__module__,f.__name__,f.__qualname__ = '__main__',name,name
    return f

def payloads(m, v):
    "door -> [(payload, the global its refusal names)]: `m` a marker file no payload may create, `v` a file none may remove or overwrite"
    import timeit, cProfile, pdb, pydoc, code, numpy as np, pandas as pd, functools, collections, _codecs
    from fastcore.xtras import run, save_pickle
    import fastai.learner
    touch,write = f'touch {m}',f"open({str(m)!r}, 'w')"
    return {
        'os and subprocess': [(Reduce(os.system, touch), 'posix.system'), (Reduce(os.remove, v), 'posix.remove'),
                              (Reduce(subprocess.Popen, ['touch', m]), 'subprocess.Popen'), (Reduce(subprocess.run, ['touch', m]), 'subprocess.run')],
        'eval and exec': [(Reduce(eval, write), 'builtins.eval'), (Reduce(exec, write), 'builtins.exec')],
        'getattr, attrgetter, methodcaller': [
            (Reduce(Reduce(getattr, Path(v), 'unlink')), 'pathlib.PosixPath.unlink'),
            (Reduce(Reduce(getattr, os, 'system'), touch), 'cloudpickle.cloudpickle.subimport'),  # cloudpickle pickles the module as a call of its `subimport`, never admitted
            (Reduce(Reduce(operator.attrgetter('system'), os), touch), 'operator.attrgetter'),
            (Reduce(operator.methodcaller('unlink'), Path(v)), 'operator.methodcaller')],
        'importers': [(Reduce(Reduce(getattr, Reduce(__import__, 'os'), 'system'), touch), 'builtins.__import__'),
                      (Reduce(importlib.import_module, 'os'), 'importlib.import_module'),
                      (Reduce(Reduce(getattr, Reduce(cloudpickle.cloudpickle.subimport, 'os'), 'system'), touch), 'cloudpickle.cloudpickle.subimport')],
        'gadgets of the packages exports use': [
            (Reduce(run, touch), 'fastcore.xtras.run'), (Reduce(save_pickle, v, 'overwritten'), 'fastcore.xtras.save_pickle'),
            (Reduce(np.save, v, np.zeros(1)), 'numpy.save'), (Reduce(torch.save, 'overwritten', v), 'torch.serialization.save'),
            (Reduce(pd.read_pickle, v), 'pandas.read_pickle'), (Reduce(fastai.learner.Learner.export, None, v), 'Learner.export'),
            (Reduce(functools.reduce, os.system, [touch], None), 'posix.system'),
            (Reduce(torch._tensor._rebuild_from_type_v2, os.system, torch.Tensor, (touch,), {}), 'posix.system')],
        "the standard library's code runners": [
            (Reduce(timeit.timeit, write), 'timeit.timeit'), (Reduce(cProfile.run, write), 'cProfile.run'), (Reduce(pdb.run, write), 'pdb.run'),
            (Reduce(pydoc.pipepager, 'text', touch), 'pydoc.pipepager'),
            (Reduce(Reduce(getattr, Reduce(code.InteractiveInterpreter), 'runsource'), write), 'code.InteractiveInterpreter')],
        "files through an admitted class's methods": [
            (Reduce(Reduce(getattr, Path, 'unlink'), Path(v)), "getattr on pathlib.Path, 'unlink'"),
            (Reduce(Reduce(getattr, type(Path(v)), 'write_text'), Path(v), 'overwritten'), "getattr on pathlib.PosixPath, 'write_text'"),
            (Reduce(collections.defaultdict, os.remove), 'collections.defaultdict with posix.remove')],
        'a pickle inside the pickle': [
            (Reduce(pickle.loads, pickle.dumps(Reduce(os.system, touch))), 'pickle.loads'),
            (Reduce(np.load, v, None, True), 'numpy.load'), (Reduce(torch.load, v), 'torch.serialization.load')],
        'code carried by value, called while loading': [
            (Reduce(carried('payload', f"def payload(): os.system({touch!r})")), 'the function __main__.payload carried as code'),
            (Reduce(carried('<lambda>', f"lambda: os.system({touch!r})")), 'the function __main__.<lambda> carried as code'),
            (Reduce(cloudpickle.cloudpickle._builtin_type, 'FunctionType'), "'FunctionType'"),
            (Reduce(_codecs.encode, 'payload', 'rot13'), "'rot13'"),
            (Reduce(iter, Reduce(os.system, touch), 'end'), 'posix.system')],
    }

CASES = [(door, i) for door,n in [('os and subprocess', 4), ('eval and exec', 2), ('getattr, attrgetter, methodcaller', 4), ('importers', 3),
         ('gadgets of the packages exports use', 8), ("the standard library's code runners", 5), ("files through an admitted class's methods", 3),
         ('a pickle inside the pickle', 3), ('code carried by value, called while loading', 5)] for i in range(n)]

@pytest.fixture(scope='module')
def learner(tmp_path_factory):
    from ddp_safe_fastai.testing import synth_learner
    return synth_learner(path=tmp_path_factory.mktemp('malicious'))

@pytest.mark.parametrize('door,i', CASES)
def test_malicious_export_refused(learner, tmp_path, door, i):
    "A real export carrying a payload: `load_learner` raises `UnsafeExportError` naming its global, and nothing ran (no marker made, the file there intact)"
    marker,victim = tmp_path/'ran',tmp_path/'victim'
    victim.write_text('intact')
    payload,named = payloads(marker, victim)[door][i]
    learner.payload = payload
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError) as e: load_learner(tmp_path/'export.pkl')
    assert named in str(e.value) and 'nothing from the file was run' in str(e.value), str(e.value)
    assert isinstance(e.value, pickle.UnpicklingError)
    assert inspect_refuses(tmp_path/'export.pkl', e.value)  # `ddp-safe-check inspect`: the load's own decision
    assert not marker.exists() and victim.read_text() == 'intact'

class PatchType:
    "A pickle that sets an attribute of the class of an object it made: `type(PosixPath('x')).exists = True`"
    def __reduce__(self): return type, (Path('x'),), (None, {'exists': True})

def legacy_file(data):
    "A file in torch's format before 1.6 (pickles in a row: its magic number, protocol and system sizes, then `data`, then the storages' keys) whose object is the pickle `data`"
    return b''.join(pickle.dumps(x, protocol=2) for x in (0x1950a86a20f9469cfc6c, 1001, {'protocol_version': 1001, 'little_endian': True})) + data + pickle.dumps([], protocol=2)

def test_malicious_raw_pickles_refused(tmp_path):
    "A pickle written by hand, in torch's older format (its object read as data like an archive's): the state of a class of this process, or of the type of an object it made, the items of a list it holds, the state of a global (its `__class__`), a global made callable by `INST`; a pickle that is no file torch writes"
    cases = {b'\x80\x02cfastai.learner\nLearner\nq\x00}q\x01X\x03\x00\x00\x00fitq\x02Nsb.': 'BUILD on fastai.learner.Learner',
             pickle.dumps(PatchType(), protocol=2): 'builtins.type with a PosixPath as argument 1',
             b'\x80\x02cbuiltins\nlist\nq\x00X\x01\x00\x00\x00xq\x01a.': 'APPEND on builtins.list',
             b'\x80\x02cos\nsystem\nN}X\t\x00\x00\x00__class__cbuiltins\nint\ns\x86b.': 'BUILD on os.system',
             b'(S"touch ' + str(tmp_path/'ran').encode() + b'"\nios\nsystem\n.': 'call os.system while loading'}
    for data,named in cases.items():
        (tmp_path/'export.pkl').write_bytes(legacy_file(data))
        with pytest.raises(UnsafeExportError, match=re.escape(named)) as e: load_learner(tmp_path/'export.pkl')
        assert inspect_refuses(tmp_path/'export.pkl', e.value)
        (tmp_path/'export.pkl').write_bytes(data)
        with pytest.raises(UnsafeExportError, match='not a file torch writes'): load_learner(tmp_path/'export.pkl')
    assert not (tmp_path/'ran').exists() and 'exists' not in vars(type(Path('x')))

def test_carried_function_named_as_the_loaders(learner, tmp_path, monkeypatch):
    "A carried function that takes the name of one the loading program defines: used in its place, never called while loading"
    called = []
    monkeypatch.setattr(sys.modules['__main__'], 'label_func', lambda *a: called.append(a), raising=False)
    learner.payload = Reduce(carried('label_func', f"def label_func(): os.system('touch {tmp_path/'ran'}')"))
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError, match='label_func carried as code'): load_learner(tmp_path/'export.pkl')
    assert not called and not (tmp_path/'ran').exists()

def test_payload_in_a_pipeline_raises_at_predict(tmp_path):
    "A function carried by value, and a global only referred to, where `predict` calls them (the loss's activation; a transform of the item pipeline): the export loads, `predict` raises naming them, nothing runs"
    from ddp_safe_fastai.testing import synth_learner
    learn,marker = synth_learner(path=tmp_path),tmp_path/'ran'
    def activation(f):
        saved,learn.loss_func.activation = learn.loss_func.activation,f
        return lambda: setattr(learn.loss_func, 'activation', saved)
    def transform(f):
        for dl in learn.dls: dl.after_item.add(Transform(f))  # `predict` takes the validation DataLoader's
        return lambda: [dl.after_item.fs.pop() for dl in learn.dls]
    places = [activation]
    try: pickle.dumps(Transform(shutil.rmtree))
    except TypeError: pass  # the dev stack (fastai 2.8.7): plum's lock makes a Transform of a function unpicklable, so no export holds one
    else: places.append(transform)
    for place in places:
        for f,named in [(carried('<lambda>', f"lambda x: os.system('touch {marker}')"), '<lambda> carried as code'), (shutil.rmtree, 'shutil.rmtree')]:
            undo = place(f)
            learn.export(tmp_path/'export.pkl')
            undo()
            inf = load_learner(tmp_path/'export.pkl')
            with pytest.raises(UnsafeExportError, match=named): inf.predict(torch.tensor([0.5, 0.5, 0.5, 0.5]))
    assert not marker.exists()

def test_torchs_older_format(learner, tmp_path, monkeypatch):
    "An export in the format torch wrote before 1.6 (pickles in a row, each module's class a persistent id) loads by default and predicts as exported; a payload in it is refused"
    from functools import partial
    x = torch.tensor([0.5, 0.5, 0.5, 0.5])
    monkeypatch.setattr(torch, 'save', partial(torch.save, _use_new_zipfile_serialization=False))
    learner.export(tmp_path/'export.pkl')
    assert not (tmp_path/'export.pkl').read_bytes().startswith(b'PK')  # not an archive
    assert load_learner(tmp_path/'export.pkl').predict(x)[0] == learner.predict(x)[0]
    learner.payload = Reduce(os.system, f"touch {tmp_path/'ran'}")
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError, match='posix.system'): load_learner(tmp_path/'export.pkl')
    assert not (tmp_path/'ran').exists()

def test_opting_in(learner, tmp_path):
    "`allow=` admits exactly the objects named; `trust=True` is fastai's load; another `pickle_module` only with `trust`, and the error says so"
    learner.payload = Reduce(Reduce, 'an object of the test module')
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError, match=r'(?s)test_safe_load\.Reduce.*allow=\[test_safe_load\.Reduce\].*ddp-safe-check inspect .*export\.pkl'): load_learner(tmp_path/'export.pkl')
    assert isinstance(load_learner(tmp_path/'export.pkl', allow=[Reduce]).payload, Reduce)
    assert isinstance(load_learner(tmp_path/'export.pkl', trust=True).payload, Reduce)
    with pytest.raises(ValueError, match=r'pickle_module=dill.*only with `trust=True`'):
        load_learner(tmp_path/'export.pkl', pickle_module=types.SimpleNamespace(__name__='dill'))
    with pytest.raises(ValueError, match="allow=.*no class or function"): load_learner(tmp_path/'export.pkl', allow=['Reduce'])

def test_trusted_load_runs_what_the_file_carries(learner, tmp_path):
    "`trust=True` is fastai's behaviour: the payload a default load refuses runs (the reason the default refuses it)"
    learner.payload = Reduce(os.system, f"touch {tmp_path/'ran'}")
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    load_learner(tmp_path/'export.pkl', trust=True)
    assert (tmp_path/'ran').exists()

def refused_on_every_rank(root):
    "Rank 0 exports a Learner carrying `os.system`; every rank loads it by default"
    from ddp_safe_fastai.testing import synth_learner
    learn = synth_learner(path=root)
    learn.payload = Reduce(os.system, f"touch {Path(root)/'ran'}")
    learn.export()
    try: load_learner(Path(root)/'export.pkl')
    except UnsafeExportError as e: return str(e)

def test_refused_on_every_rank(tmp_path):
    "Under DDP every rank checks what it reads and raises the same `UnsafeExportError`, at the same call"
    said = values(ranks(refused_on_every_rank, str(tmp_path)))
    assert said[0] == said[1] and 'posix.system' in said[0], said
    assert not (tmp_path/'ran').exists()

def exported_inside_distrib_ctx(root):
    "A DDP fit inside fastai's `distrib_ctx`, then the export and its default load on every rank, still inside it"
    from ddp_safe_fastai.testing import synth_learner
    importlib.import_module('fastai.distributed')  # `Learner.distrib_ctx`
    learn = synth_learner(path=root)
    with learn.distrib_ctx():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        learn.export('inside.pkl')
        inf = load_learner(Path(root)/'inside.pkl')
        still = [type(cb).__name__ for cb in learn.cbs]
    x = torch.tensor([0.5, 0.5, 0.5, 0.5])
    return dict(loaded=[type(cb).__name__ for cb in inf.cbs], kept=still, same=float(inf.predict(x)[0][0]) == float(learn.predict(x)[0][0]))

def test_export_inside_distrib_ctx_loads(tmp_path):
    "An export made inside `distrib_ctx` right after a DDP fit loads by default on every rank and predicts as the Learner does: it leaves out what only DDP training needs (fastai's `DistributedTrainer` and its `Accelerator`), which the Learner keeps"
    for res in values(ranks(exported_inside_distrib_ctx, str(tmp_path), init=False)):
        assert 'DistributedTrainer' not in res['loaded'] and 'DistributedTrainer' in res['kept'] and res['same'], res

def test_unlisted_module_never_imported(learner, tmp_path, monkeypatch):
    "A global of a module outside the policy that the file only refers to: a stand-in, and the module (whose import would run its code) never imported"
    (tmp_path/'side_effect_module.py').write_text(f"open({str(tmp_path/'imported')!r}, 'w').close()\ndef helper(x): return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import side_effect_module
    learner.payload = side_effect_module.helper
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    (tmp_path/'imported').unlink(); del sys.modules['side_effect_module']
    inf = load_learner(tmp_path/'export.pkl')
    assert not (tmp_path/'imported').exists() and 'side_effect_module' not in sys.modules
    with pytest.raises(UnsafeExportError, match=r'side_effect_module\.helper was not loaded from the export'): inf.payload(1)

def test_what_a_guard_calls_and_what_a_load_shares(tmp_path):
    "Hand-built pickles a reviewer found: a guard (`functools.reduce`) calling another guard, whose arguments nothing checks; a class given a carried function's state through `reduce`, or a carried class's body (cloudpickle's `_class_setstate` on `Path`); a shared enum member given state; a carried function's `target` set by `BUILD`. Each refused, nothing run or changed"
    import inspect, pathlib, cloudpickle
    from pickle import PROTO, STACK_GLOBAL, MARK, TUPLE, LIST, DICT, REDUCE, NEWOBJ_EX, STOP, NONE, BUILD, BININT1, SHORT_BINUNICODE, EMPTY_DICT, SETITEM, TUPLE2
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    s = lambda x: SHORT_BINUNICODE + bytes([len(x.encode())]) + x.encode()
    g = lambda m, n: s(m) + s(n) + STACK_GLOBAL
    marker = tmp_path/'ran'
    code = g(f"open({str(marker)!r},'w').write('ran')#", 'x')  # a stand-in whose name is code
    partial_ = lambda *parts: g('functools', 'partial') + MARK + g('fastcore.basics', '_using_attr') + b''.join(parts) + TUPLE + REDUCE
    a = g('functools', 'partial') + MARK + g('fastcore.basics', '_using_attr') + TUPLE + MARK + s('attr') + s('name') + s('x') + code + DICT + NEWOBJ_EX
    exec_ = PROTO + b'\x04' + g('functools', 'reduce') + MARK + g('functools', 'reduce') + MARK + partial_(partial_(a, s('exec'))) + MARK + s('__self__') + g('builtins', 'print') + LIST + LIST + TUPLE + REDUCE + STOP
    state = MARK + NONE + MARK + s('__module__') + s('builtins') + s('__qualname__') + s('print') + DICT + TUPLE
    setstate = PROTO + b'\x04' + g('functools', 'reduce') + MARK + g('cloudpickle.cloudpickle', '_function_setstate') + MARK + g('pathlib', 'Path') + state + LIST + TUPLE + REDUCE + STOP
    member = PROTO + b'\x04' + g('inspect', '_ParameterKind') + MARK + BININT1 + b'\x01' + TUPLE + REDUCE + MARK + s('_value_') + BININT1 + b'\x07' + DICT + BUILD + STOP
    target = cloudpickle.dumps(carried('label_func', 'def label_func(x): return x'))[:-1] + NONE + EMPTY_DICT + s('target') + g('builtins', 'print') + SETITEM + TUPLE2 + BUILD + STOP
    class_body = PROTO + b'\x04' + g('cloudpickle.cloudpickle', '_class_setstate') + MARK + g('pathlib', 'Path') + MARK + MARK + s('exists') + BININT1 + b'\x01' + DICT + MARK + DICT + TUPLE + TUPLE + REDUCE + STOP
    for data,named in [(exec_, 'functools.reduce with functools.reduce as argument 1'), (setstate, 'functools.reduce with cloudpickle.cloudpickle._function_setstate as argument 1'),
                       (class_body, 'set the attributes of pathlib.Path, not a class the file carries'),
                       (member, 'inspect._ParameterKind while loading, which the policy does not admit'), (target, 'give what cloudpickle.cloudpickle._make_function makes a state')]:
        with pytest.raises(UnsafeExportError, match=re.escape(named)): ExportPickle().loads(data)
    assert not marker.exists() and pathlib.Path('/a/b').name == 'b' and not hasattr(pathlib.Path, 'target') and callable(pathlib.Path.exists)
    assert inspect.Parameter.POSITIONAL_OR_KEYWORD.value == 1

class Swapping(io.BytesIO):
    "A file that serves other bytes once it has been read and sought back to its start: what a file system an attacker serves may do between two reads"
    def __init__(self, first, then): super().__init__(first); self.then = then
    def seek(self, pos, whence=0):
        if pos == 0 and whence == 0 and self.then is not None and self.tell() > 2:
            then,self.then = self.then,None
            super().seek(0); super().truncate(); super().write(then)
        return super().seek(pos, whence)

def test_a_file_changed_between_the_check_and_the_load(tmp_path):
    "The load unpickles the bytes its dry run read, not the file again: a file that changes once read (torch's older format hands the open file itself) loads what was checked"
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    benign,evil = pickle.dumps({'w': 1}, protocol=2),pickle.dumps(Reduce(os.system, f"touch {tmp_path/'ran'}"), protocol=2)
    assert ExportPickle().load(Swapping(benign, evil)) == {'w': 1}
    assert not (tmp_path/'ran').exists()

def test_loads_at_once_in_threads(tmp_path):
    "Loads in threads at once, as a server makes them: the tokens of admitted globals serve every dry run, and each reports to its own (each refusal lists its own file's globals, never another's; an admitted pickle loads)"
    import threading
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns at almost every bytecode
    files = {named: pickle.dumps([Path('x'), collections.OrderedDict(a=1), Reduce(f, f"touch {tmp_path/'ran'}")], protocol=4)
             for named,f in [('posix.system', os.system), ('subprocess.run', subprocess.run)]}
    found,ok = {named: set() for named in files},[]
    def load(named, data):
        for _ in range(50):
            try: ExportPickle(source=named).loads(data)
            except UnsafeExportError as e: found[named].update(n for n in files if n in str(e))
            ok.append(ExportPickle().loads(pickle.dumps([Path('y'), collections.OrderedDict(b=2)], protocol=4)) == [Path('y'), {'b': 2}])
    threads = [threading.Thread(target=load, args=kv) for kv in files.items()]
    try:
        for t in threads: t.start()
        for t in threads: t.join(120)
    finally: sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), 'a load never ended'
    assert found == {named: {named} for named in files} and len(ok) == 100 and all(ok), (found, ok.count(False))
    assert not (tmp_path/'ran').exists()

def test_extension_codes_refused(tmp_path):
    "A process that registered a pickle extension code (`copyreg.add_extension`): pickle keeps what a code names process-wide, so a load is refused while one is registered"
    import copyreg
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    ext,touch = b'\x80\x02\x84\xf0\xff\x7f\x00',f"touch {tmp_path/'ran'}".encode()
    copyreg.add_extension('posix', 'system', 0x7ffff0)
    try:
        assert pickle.loads(ext + b'.') is os.system  # a trusted load: pickle now keeps os.system for the code
        with pytest.raises(UnsafeExportError, match='extension code'):
            ExportPickle().loads(ext + b'X' + len(touch).to_bytes(4, 'little') + touch + b'\x85R.')
    finally: copyreg.remove_extension('posix', 'system', 0x7ffff0); copyreg.clear_extension_cache()
    assert not (tmp_path/'ran').exists() and ExportPickle().loads(pickle.dumps({'w': 1}, protocol=2)) == {'w': 1}

def call_pickle(module, name, args):
    "A pickle that calls `module.name(*args)`: the tuple `args` as pickle writes it, then REDUCE"
    return b'\x80\x02c' + f'{module}\n{name}\n'.encode() + pickle.dumps(tuple(args), protocol=2)[2:-1] + b'R.'

@pytest.mark.filterwarnings('ignore:dtype')  # numpy's, of an attacker's `align`
def test_admitted_callables_with_an_attackers_arguments(tmp_path, monkeypatch):
    "Each global the policy lets a file call while loading, called with arguments an attacker chooses (a command, a path, a module's name, functions the policy does not admit, which come as stand-ins): no command runs, no file is written or removed, no module is imported"
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    marker,victim = tmp_path/'ran',tmp_path/'victim'
    victim.write_text('intact')
    (tmp_path/'attacker_module.py').write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    touch = f'touch {marker}'
    argsets = [(), (touch,), (str(victim),), ('attacker_module',), (os.system,), (os.system, touch), (touch, os.system),
               (eval, f"open({str(marker)!r}, 'w')"), (os.remove, str(victim)), (os.system, torch.Tensor, (touch,), {}),
               (os.system, [touch], None), (Path(victim), 'unlink'), (os.system, touch, 'strict'), ([os.system], touch, 1)]
    policy,tried = export_policy(),0
    for (module,name),admitted in policy.items():
        if admitted.kind != 'call': continue
        for args in argsets:
            tried += 1
            try: ExportPickle().loads(call_pickle(module, name, args))
            except Exception: pass  # refused: by the types its line names, by a stand-in it called, or by the callable itself (a TypeError...)
            assert not marker.exists() and victim.read_text() == 'intact', (module, name, args)
            assert 'attacker_module' not in sys.modules, (module, name, args)
    assert tried >= 14*30

# --- payloads that run after the load: the file sets the state of everything it builds, and fastai then calls that state
def tamper(file, change):
    "Rewrite the export `file`: loaded as fastai loads it (the test's own file), `change(learn)`, saved as `Learner.export` saves"
    learn = torch.load(file, weights_only=False)
    change(learn)
    torch.save(learn, file, pickle_module=cloudpickle, pickle_protocol=2)

class Watch:
    "What no payload may change: a marker file, a victim file, the environment, the classes' attributes, the policy; `use` calls what users call after a load"
    def __init__(self, tmp_path):
        from fastai.learner import Learner
        from fastai.data.core import DataLoaders
        self.marker,self.victim,self.classes = tmp_path/'ran',tmp_path/'victim',(Learner, DataLoaders, type(Path('.')), Path)
        self.victim.write_text('intact')
        self.snapshot()

    def snapshot(self):
        "What `check` compares against: taken once the test's imports are done (fastai's modules add methods to `Learner` as they are imported)"
        self.env,self.attrs,self.policy = dict(os.environ),[set(vars(c)) for c in self.classes],dict(export_policy())

    def use(self, learn):
        "`predict`, `get_preds`, and `fine_tune(1)` on new DataLoaders: each may raise `UnsafeExportError` (a stand-in called), nothing else"
        from ddp_safe_fastai.testing import synth_learner
        x = torch.tensor([0.5, 0.5, 0.5, 0.5])
        calls = [lambda: learn.predict(x), lambda: learn.get_preds(dl=learn.dls.test_dl([0, 1]) if learn.dls.loaders else None),
                 lambda: (setattr(learn, 'dls', synth_learner(path=learn.path).dls), learn.fine_tune(1))]
        for call in calls:
            try:
                with learn.no_bar(), learn.no_logging(): call()
            except UnsafeExportError: pass

    def check(self):
        assert not self.marker.exists() and self.victim.read_text() == 'intact'
        assert dict(os.environ) == self.env and [set(vars(c)) for c in self.classes] == self.attrs
        assert dict(export_policy()) == self.policy and isinstance(export_policy(), types.MappingProxyType)

def after_load_payloads(w, root):
    "kind -> [(change to a real export, what the refusal names)]: each reaches fastai's calls after the load (`load_learner`'s, `predict`'s, the callbacks' events)"
    import functools, fastcore.basics, fastai.data.load, fastai.callback.hook, fastai.vision.core
    from fastai.callback.tracker import SaveModelCallback
    from fastai.callback.progress import CSVLogger
    from fastai.data.core import TfmdLists
    def cb(learn, **state):
        c = learn.cbs[0]
        for k,v in state.items(): setattr(c, k, v)
    def act(f): return lambda learn: setattr(learn, 'loss_func', f)  # fastai calls it in `fine_tune` and `get_preds`
    victim = w.victim
    return {
        "the state of what `load_learner` calls (`dls.cpu`, a callback's events)": [
            (lambda l: setattr(l.dls, 'cpu', fastai.data.load._wif), 'in the place of its class\'s method cpu'),
            (lambda l: setattr(l.dls, 'cpu', print), 'in the place of its class\'s method cpu'),
            (lambda l: cb(l, after_validate=print), "in the place of its class's method after_validate"),
            (lambda l: cb(l, before_fit=types.MethodType(fastai.data.core.FilteredBase.dataloaders, l.dls.train.dataset)), "in the place of its class's method before_fit")],
        'delegation to what the file chooses': [
            (lambda l: cb(l, _default='victim_path', victim_path=Path(victim)), "its delegation is its class's"),
            (lambda l: setattr(l, 'loss_func', functools.partial(l.cbs[0], 'unlink')), 'functools.partial with a TrainEvalCallback as argument 1: it takes function there'),
            (lambda l: setattr(l.dls.loaders[0], 'dataset', Path(victim)), 'to which it would hand its attributes'),
            (lambda l: l.model._modules.__setitem__('extra', Path(victim)), 'a Linear._modules holds a dict: its kind holds a dict of modules by name')],
        "fastai's own functions where fastai calls them": [
            (act(fastai.data.load._wif), 'admits it only as the attribute fastai.data.load._FakeLoader.worker_init_fn'),
            (act(functools.partial(fastcore.basics._using_attr, print, '__globals__')), "only a function and a public attribute's name"),
            (act(functools.partial(fastai.vision.core.load_image, str(victim))), 'functools.partial with fastai.vision.core.load_image as argument 1'),
            (act(fastai.callback.hook.Hook.hook_fn), 'admits it only bound to a fastai.callback.hook.Hook'),
            (act(types.MethodType(fastai.callback.hook.Hook.hook_fn, TfmdLists(['a'], None))), 'bind fastai.callback.hook.Hook.hook_fn to a TfmdLists'),
            (lambda l: setattr(l, 'loss_func', types.MethodType(fastai.data.core.FilteredBase.dataloaders, l.cbs[0])), 'bind fastai.data.core.FilteredBase.dataloaders to a TrainEvalCallback')],
        "a guard of the load, kept in what it built": [
            (act(getattr), 'builtins.getattr, which the load only calls'), (act(functools.reduce), 'functools.reduce, which the load only calls')],
        'files the file names, written or read': [
            (lambda l: setattr(l, 'model_dir', str(root/'elsewhere')), 'model_dir'),
            (lambda l: l.add_cb(SaveModelCallback(fname='../victim')), "fname holds '../victim', a place outside the Learner's folder"),
            (lambda l: setattr(l.cbs[0], 'learn', torch.load(root/'export.pkl', weights_only=False)), 'a TrainEvalCallback.learn holds a Learner: its kind holds the Learner the file holds'),
            (lambda l: l.add_cb(tensorboard_callback(log_dir=str(root/'elsewhere'))), "log_dir holds '/"),
            (lambda l: l.add_cb(CSVLogger(fname=str(root/'victim'))), "a CSVLogger.fname holds '/")],
        'memory out of proportion': [
            (lambda l: setattr(l, 'payload', torch.zeros(1).expand(10**8)), 'views of 100000000 elements over 1 elements'),
            (lambda l: setattr(l.model, 'extra', torch.nn.Parameter(torch.zeros(2).expand(10**6, 2), requires_grad=False)), 'views of 2000000 elements over 2 elements')],
    }

AFTER_LOAD = [(kind, i) for kind,n in [("the state of what `load_learner` calls (`dls.cpu`, a callback's events)", 4), ('delegation to what the file chooses', 4),
              ("fastai's own functions where fastai calls them", 6), ('a guard of the load, kept in what it built', 2),
              ('files the file names, written or read', 5), ('memory out of proportion', 2)] for i in range(n)]

def tensorboard_callback(**kwargs):
    "fastai's `TensorBoardCallback`, where tensorboard is installed (the latest stack)"
    pytest.importorskip('tensorboard')
    from fastai.callback.tensorboard import TensorBoardCallback
    return TensorBoardCallback(**kwargs)

@pytest.mark.parametrize('kind,i', AFTER_LOAD)
def test_payloads_after_the_load_refused(learner, tmp_path, kind, i):
    "An export whose state reaches what fastai calls after the load: `load_learner` raises `UnsafeExportError` saying what holds what; then nothing ran, nothing changed (a default load that loads would be used as users use it)"
    w = Watch(tmp_path)
    learner.export(tmp_path/'export.pkl')
    change,named = after_load_payloads(w, tmp_path)[kind][i]
    tamper(tmp_path/'export.pkl', change)
    w.snapshot()
    with pytest.raises(UnsafeExportError) as e: w.use(load_learner(tmp_path/'export.pkl'))
    assert named in str(e.value), str(e.value)
    assert inspect_refuses(tmp_path/'export.pkl', e.value)
    w.check()

def test_main_stands_in_only_for_its_own_functions(learner, tmp_path, monkeypatch):
    "A carried function named like one a star import put in the loader's `__main__` (fastcore's `run`, this library's `load_learner`) stays a stand-in: it raises when fastai calls it, the imported function never called; one the loading script defines itself takes its place"
    w,called,saved = Watch(tmp_path),[],learner.loss_func
    def imported(*args): called.append(args)  # a function of a module (this test's), as a star import brings one
    main = sys.modules['__main__']
    for name in ('run', 'load_learner', 'exec_eval'):
        monkeypatch.setattr(main, name, imported, raising=False)
        learner.loss_func = carried(name, f"def {name}(*x): os.system('touch {w.marker}')")
        try: learner.export(tmp_path/'export.pkl')
        finally: learner.loss_func = saved
        inf = load_learner(tmp_path/'export.pkl')
        with pytest.raises(UnsafeExportError, match=f'{name} carried as code'): inf.loss_func(torch.zeros(1), torch.zeros(1))
        w.use(inf)
    assert not called
    w.check()
    script = {'__name__': '__main__', 'called': called}
    exec("def run(*x): called.append(x)", script)  # as the loading script defines it
    own = script['run']
    monkeypatch.setattr(main, 'run', own)
    learner.loss_func = carried('run', 'def run(*x): return x')
    try: learner.export(tmp_path/'export.pkl')
    finally: learner.loss_func = saved
    load_learner(tmp_path/'export.pkl').loss_func(torch.zeros(1), torch.zeros(1))
    assert called

def test_a_safe_load_reads_only_weights_after(learner, tmp_path):
    "A Learner a default load made, fine-tuned with the exporter's `SaveModelCallback`: fastai's reload of the best model asks for `weights_only=False`; a file there holding a payload is refused by the weights-only read, and nothing runs; its own best model is saved and read again"
    from fastai.callback.tracker import SaveModelCallback
    from ddp_safe_fastai.testing import synth_learner
    from ddp_safe_fastai.errors import CheckpointError
    w = Watch(tmp_path)
    learner.export(tmp_path/'export.pkl')
    tamper(tmp_path/'export.pkl', lambda l: l.add_cb(SaveModelCallback(fname='best', every_epoch=False, at_end=False)))
    inf = load_learner(tmp_path/'export.pkl')
    assert inf.path == tmp_path and inf.model_dir == 'models'
    inf.dls = synth_learner(path=tmp_path).dls
    real_save = type(inf).save
    def planted(self, file, **kwargs):  # the best model's file, replaced by one an attacker left there
        (tmp_path/'models').mkdir(exist_ok=True)
        torch.save(Reduce(os.system, f"touch {w.marker}"), tmp_path/'models'/f'{file}.pth')
    type(inf).save = planted
    try:
        with pytest.raises(CheckpointError, match="best.pth: it holds objects that are not plain weights"):
            with inf.no_bar(), inf.no_logging(): inf.fine_tune(1)
    finally: type(inf).save = real_save
    w.check()
    inf2 = load_learner(tmp_path/'export.pkl')
    inf2.dls = synth_learner(path=tmp_path).dls
    with inf2.no_bar(), inf2.no_logging(): inf2.fine_tune(1)  # its own best model, saved and read again: weights
    assert (tmp_path/'models'/'best.pth').exists()

class Fetches:
    "A class a user admits with `allow=`, whose `__setstate__` fetches a function by the name the file gives"
    def __init__(self, name): self.name = name
    def __getstate__(self): return {'name': self.name}
    def __setstate__(self, state): self.f = getattr(os, state['name'])

def test_a_function_the_load_did_not_hand_out(learner, tmp_path):
    "A function in what the load built that its unpickler never handed out (here fetched by an admitted class's `__setstate__`, by a name the file chose): refused, never called"
    w = Watch(tmp_path)
    learner.payload = Fetches('system')
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError, match=r"test_safe_load\.Fetches, whose __setstate__ \(test_safe_load\.Fetches's\) the policy has not reviewed"):
        load_learner(tmp_path/'export.pkl', allow=[Fetches])
    learner.payload = Fetches('getcwd')
    try: learner.export(tmp_path/'export.pkl')
    finally: del learner.payload
    with pytest.raises(UnsafeExportError, match='the policy has not reviewed'): load_learner(tmp_path/'export.pkl', allow=[Fetches])
    w.check()

def test_a_refusal_says_everything_at_once(learner, tmp_path, monkeypatch):
    "An export holding a user's model class and loss of their own module, beside a payload: one refusal names each global it would call or build and each that would stand in, the `allow=` that admits the user's own (never the standard library's or a library's internal), and `ddp-safe-check inspect`; with that `allow=` and no payload it loads and predicts"
    (tmp_path/'my_models.py').write_text("import torch\nclass Net(torch.nn.Module):\n    def __init__(self): super().__init__(); self.lin = torch.nn.Linear(4, 1)\n"
                                         "    def forward(self, x): return self.lin(x)\ndef my_loss(pred, y): return ((pred.flatten() - y.flatten())**2).mean()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_models
    model,loss = learner.model,learner.loss_func
    learner.model,learner.loss_func = my_models.Net(),my_models.my_loss
    x = torch.tensor([0.5, 0.5, 0.5, 0.5])
    try:
        expected = learner.predict(x)[0]
        learner.export(tmp_path/'mine.pkl')
        learner.payload = Reduce(os.system, f"touch {tmp_path/'ran'}")
        learner.export(tmp_path/'export.pkl')
    finally: learner.model,learner.loss_func = model,loss; del learner.payload
    with pytest.raises(UnsafeExportError) as e: load_learner(tmp_path/'export.pkl')
    said = str(e.value)
    for part in ['build my_models.Net', 'call posix.system', 'stand in and raise if called: my_models.my_loss', 'allow=[my_models.Net, my_models.my_loss]`',
                 f"ddp-safe-check inspect {tmp_path/'export.pkl'}"]:
        assert part in said, (part, said)
    assert 'allow=[posix' not in said and 'posix.system,' not in said and not (tmp_path/'ran').exists()
    cli = subprocess.run([Path(sys.executable).parent/'ddp-safe-check', 'inspect', str(tmp_path/'export.pkl')], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1 and said.split(': ', 1)[1] in cli.stdout, cli.stdout + cli.stderr  # the command says what the load says
    assert load_learner(tmp_path/'mine.pkl', allow=[my_models.Net, my_models.my_loss]).predict(x)[0] == expected

CLASS_IN_A_NOTEBOOK = """
import sys, torch
from pathlib import Path
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
class MainModel(torch.nn.Module):
    def __init__(self): super().__init__(); self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        BODY
learn = synth_learner(path='.')
learn.model = MainModel()
x = torch.tensor([0.5, 0.5, 0.5, 0.5])
if sys.argv[1] == 'export': learn.export('export.pkl'); print(float(learn.predict(x)[0][0]))
else: print(float(load_learner('export.pkl').predict(x)[0][0]))
"""

def test_a_class_carried_from_a_notebook(tmp_path):
    "A model class defined where the exporter ran (`__main__`, a notebook's): cloudpickle carries it by value. A loading script that defines no class of that name is refused, told to define it (never to admit cloudpickle's internals); one that defines it loads with its own class, never the file's body, and predicts as the exporter did"
    def script(name, body):
        (tmp_path/name).write_text(CLASS_IN_A_NOTEBOOK.replace('BODY', body)); return name
    run = lambda *a: subprocess.run([sys.executable, *a], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    made = run(script('exporter.py', f"open({str(tmp_path/'ran')!r}, 'w'); return self.lin(x)"), 'export')
    assert made.returncode == 0, made.stderr[-3000:]
    (tmp_path/'ran').unlink()
    (tmp_path/'none.py').write_text("from ddp_safe_fastai.all import *\nload_learner('export.pkl')\n")
    refused = run('none.py')
    assert 'define a class MainModel in the loading script' in refused.stderr and '_make_skeleton_class' not in refused.stderr, refused.stderr[-3000:]
    loaded = run(script('loader.py', 'return self.lin(x)'), 'load')
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split()[-1] == made.stdout.split()[-1] and not (tmp_path/'ran').exists()

def test_nesting_and_counts_bounded_by_the_file():
    "Values nested five thousand deep (ten kilobytes: a user's `export` of them again would overflow pickle's recursion) are refused; a pickle of more objects than the reader's limit is refused as it is read, before anything is checked or built"
    from ddp_safe_fastai.safe_unpickle import ExportPickle
    deep = b'\x80\x02' + b']' * 5000 + b'a' * 4999 + b'.'
    with pytest.raises(UnsafeExportError, match='nested deeper than 1000'): ExportPickle().loads(deep)
    many = b'\x80\x02(' + b']' * 1_000_001 + b'l.'
    with pytest.raises(UnsafeExportError, match='more than 1000000 objects'): ExportPickle().loads(many)
    assert ExportPickle().loads(b'\x80\x02' + b']' * 50 + b'a' * 49 + b'.') is not None  # fifty deep: as an export nests

def zip_of(path, records, aliases=(), method=0):
    "A zip of `records` [(name, bytes)], each stored (or deflated: `method` 8) after its local header, as torch lays an archive out; `aliases` [(name, name of a record)] more names in its directory for a record's same bytes"
    import zlib, struct
    out,directory,at = bytearray(),[],{}
    for name,data in records:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        raw = c.compress(data) + c.flush() if method else data
        crc,n = zlib.crc32(data),name.encode()
        at[name] = (len(out), crc, len(raw), len(data))
        out += struct.pack('<4s5H3I2H', b'PK\x03\x04', 20, 0, method, 0, 0, crc, len(raw), len(data), len(n), 0) + n + raw
    for name,target in [(n, n) for n,_ in records] + list(aliases):
        offset,crc,size,usize = at[target]
        n = name.encode()
        directory.append(struct.pack('<4s6H3I5H2I', b'PK\x01\x02', 20, 20, 0, method, 0, 0, crc, size, usize, len(n), 0, 0, 0, 0, 0, offset) + n)
    cd = b''.join(directory)
    Path(path).write_bytes(bytes(out) + cd + struct.pack('<4s4H2IH', b'PK\x05\x06', 0, 0, len(directory), len(directory), len(cd), len(out), 0))
    return path

def test_storages_copied_beside_the_check(learner, tmp_path, monkeypatch):
    "The default load copies an archive's storages in a thread while it checks the pickle (`ArchiveStorages`): the weights are torch's own; only an archive laid out as torch writes it is read so (a record named twice over the same bytes, past the file's end, or deflated: torch reads it), a storage of another size than its id says is refused as torch refuses it; a copy slower than the build is waited for (a big-endian archive's storages swapped once there), one that fails or never ran is an error, never tensors of what memory held"
    from ddp_safe_fastai.safe_unpickle import ArchiveStorages, ExportPickle, export_verdict
    learner.export(tmp_path/'export.pkl')
    assert ArchiveStorages(tmp_path/'export.pkl').ok
    ours,fastais = load_learner(tmp_path/'export.pkl'),load_learner(tmp_path/'export.pkl', trust=True)
    assert all(torch.equal(a, b) for a,b in zip(ours.model.state_dict().values(), fastais.model.state_dict().values()))
    w = torch.arange(6.).view(2, 3)
    torch.save({'w': w, 'v': w[1]}, tmp_path/'x.pt')
    with zipfile.ZipFile(tmp_path/'x.pt') as z: records = [(i.filename, z.read(i)) for i in z.infolist()]
    data = next(n for n,_ in records if n.endswith('/data/0'))
    def load(f):
        with ArchiveStorages(f) as s: return s.ok,torch.load(s.file, weights_only=False, pickle_module=ExportPickle(storages=s))
    ok,x = load(zip_of(tmp_path/'same.pt', records))
    assert ok and torch.equal(x['w'], w) and x['v'].untyped_storage().data_ptr() == x['w'].untyped_storage().data_ptr()  # one storage, two views
    many = zip_of(tmp_path/'many.pt', records, [(data[:-1] + str(k), data) for k in range(1, 1000)])  # a thousand names for one storage's bytes
    assert not ArchiveStorages(many).ok and torch.equal(load(many)[1]['w'], w)
    past = bytearray(zip_of(tmp_path/'past.pt', records).read_bytes())
    i = past.rindex(data.encode()) - 46  # its directory's entry: sizes at 20 and 24
    past[i + 20:i + 28] = (1 << 31).to_bytes(4, 'little') * 2
    (tmp_path/'past.pt').write_bytes(past)
    assert not ArchiveStorages(tmp_path/'past.pt').ok  # never allocated: torch says what is wrong
    deflated = zip_of(tmp_path/'deflated.pt', records, method=8)
    assert not ArchiveStorages(deflated).ok and torch.equal(load(deflated)[1]['w'], w)
    longer = zip_of(tmp_path/'longer.pt', [(n, d + bytes(8) if n == data else d) for n,d in records])
    with pytest.raises(RuntimeError, match='does not match expected size'): torch.load(longer, weights_only=False)
    with pytest.raises(UnsafeExportError, match="a storage '0' of 32 bytes, which its id says holds 6 elements"): load(longer)
    assert "a storage '0' of 32 bytes, which its id says holds 6 elements of torch.float32" in str(export_verdict(longer))  # inspect says it too
    with monkeypatch.context() as m:
        m.delattr(os, 'preadv')  # Windows: torch reads the storages
        assert not ArchiveStorages(tmp_path/'same.pt').ok and torch.equal(load(tmp_path/'same.pt')[1]['w'], w)
    copy = ArchiveStorages.copy
    monkeypatch.setattr(ArchiveStorages, 'copy', lambda self, parts: (time.sleep(1), copy(self, parts)))  # a disk slower than the check and the build
    with ArchiveStorages(tmp_path/'same.pt') as s:
        x = torch.load(s.file, weights_only=False, pickle_module=ExportPickle(storages=s))
        assert torch.equal(x['w'], w)  # every byte there when the load returns
    big = zip_of(tmp_path/'big.pt', [(n, b'big' if n.endswith('/byteorder') else d) for n,d in records])  # swapped once copied, as torch swaps it
    assert ArchiveStorages(big).ok and torch.equal(load(big)[1]['w'], torch.load(big, weights_only=False)['w'])
    monkeypatch.setattr(os, 'preadv', lambda fd, views, at: 0)  # the file ends before its storages
    with pytest.raises(UnsafeExportError, match='ended before its storages'): load(tmp_path/'same.pt')
    monkeypatch.setattr(ArchiveStorages, 'copy', lambda self, parts: None)  # a copy that never ran: never tensors of what memory held
    with pytest.raises(UnsafeExportError, match='its storages were not copied'): load(tmp_path/'same.pt')

def test_a_dtype_the_build_would_refuse_refused_by_the_check(tmp_path):
    "A numpy dtype of a descr that is no plain dtype's ('cpu', fields): refused by the check, so that inspect refuses it as the load does (the fuzzer found the load refusing it in the build, after inspect had admitted it)"
    from ddp_safe_fastai.safe_unpickle import ExportPickle, check_tree
    from ddp_safe_fastai.export_reader import read_pickle
    for descr in (b'cpu', b'[("a", "<f8")]'):
        data = b'\x80\x02cnumpy\ndtype\nX' + len(descr).to_bytes(4, 'little') + descr + b'\x89\x88\x87R.'
        with pytest.raises(UnsafeExportError, match='as argument 1: it takes descr there'): check_tree(read_pickle(data))
        with pytest.raises(UnsafeExportError, match='as argument 1: it takes descr there'): ExportPickle().loads(data)
    import numpy as np
    assert ExportPickle().loads(b'\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00f8\x89\x88\x87R.') == np.dtype('f8')
