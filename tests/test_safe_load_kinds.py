"""The default `load_learner` (nbs/15_safe_unpickle.ipynb) against the kinds of payload a security review ran through it:
state its old check never read (slots, a parameter's attributes, callbacks that are none), code an admitted class's
`__setstate__` runs, process-wide state, places outside the Learner's folder, crashes, time and memory bombs, an old
format's FIFO, and what a refusal advises. Each export is a real Learner's, changed as an attacker would; each is loaded
in a child process (`tools/fuzz_exports.py`'s), then used as a user does (`predict`, `get_preds`, `fine_tune(1)` on new
DataLoaders, `lr_find`, `export` again), and nothing may escape: no marker made, no file removed, no environment
variable, class attribute or hook registry changed, no crash, time and memory bounded. `ddp-safe-check inspect` decides
as the load does, on every file. Then the fuzzer's 500 mutants with a fixed seed."""
import os, sys, pickle, tarfile, importlib
from pathlib import Path
import pytest, torch, numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent/'tools'))
import fuzz_exports
pytestmark = pytest.mark.xdist_group('safe_load_kinds')  # no corpus of its own: beside test_safe_load's

class Reduce:
    "What a malicious export carries: an object whose pickle calls `func(*args)` as it loads, with `state` given after"
    def __init__(self, func, *args, state=None): self.func,self.args,self.state = func,args,state
    def __reduce__(self): return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)

def tampered(root, file, change):
    "A Learner of its own (`testing.synth_learner`, in `root`), changed by `change`, then exported to `file` by `Learner.export`"
    from ddp_safe_fastai.testing import synth_learner
    l = synth_learner(path=root)
    change(l)
    l.export(file)
    return file

def payloads(root, marker, victim):
    "name -> (change to a real Learner, what the refusal names, or None: it loads and is used with nothing escaping)"
    from fasttransform.transform import Transform
    from fastai.callback.hook import Hook
    from fastai.callback.tracker import SaveModelCallback
    from fastcore.foundation import L
    from fastcore.xtras import ReindexCollection
    from ddp_safe_fastai.all import CheckpointCallback
    import shutil
    def param(l):
        p = l.model.weight; p.victim = Path(victim)  # a parameter with attributes: torch pickles its state
    def tensor_grad(l):
        from fastai.torch_core import TensorBase
        t = TensorBase(torch.ones(2)); t.__dict__['grad'] = torch.zeros(2); l.payload = t
    def lstm(l, value):
        m = torch.nn.LSTM(4, 4); m._all_weights = value; l.model = torch.nn.Sequential(l.model); l.lstm = m
    def hook(l):
        from fastai.callback.hook import _hook_inner
        h = Hook(l.model, _hook_inner); h.hook.id = 10**18; l.hook = h  # a handle whose id would raise torch's next_id
    try: pickle.dumps(Transform(shutil.rmtree)); dispatch = {'dispatch_to_rmtree': (lambda l: [dl.after_item.add(Transform(shutil.rmtree)) for dl in l.dls], None)}  # a stand-in in the table: predict raises, nothing removed
    except TypeError: dispatch = {}  # the dev stack (fastai 2.8.7): plum's lock makes a Transform of a function unpicklable, so no export holds one
    return {**dispatch,
        # state the old check never read
        'callbacks_that_are_none': (lambda l: l.cbs.append(Path(victim)), 'a list of Callback objects'),
        'parameter_with_attributes': (param, 'torch._utils._rebuild_parameter_with_state'),
        'tensor_with_grad': (tensor_grad, "with ['grad'] set: only its plain attributes"),
        # code an admitted class's `__setstate__` runs on what the file chose
        'rnn_setstate_indexes_an_L': (lambda l: lstm(l, L([['weight_ih_l0']])), 'a LSTM._all_weights holds a L'),
        'rnn_setstate_indexes_reindexed': (lambda l: lstm(l, ReindexCollection([['weight_ih_l0']])), 'a LSTM._all_weights holds a ReindexCollection'),  # its __getitem__ runs its `tfm`
        # process-wide state
        'hook_handle_raises_next_id': (hook, None),
        'state_of_a_class': (lambda l: setattr(l, 'payload', Reduce(torch.utils.hooks.RemovableHandle, state={'next_id': 10**18})), 'RemovableHandle'),
        # places outside the Learner's folder
        'file_url': (lambda l: l.add_cb(SaveModelCallback(fname=f'file://{root}/elsewhere')), "file://"),
        'bucket_the_file_names': (lambda l: l.add_cb(CheckpointCallback(fname='s3://attacker-bucket/run')), "'s3://attacker-bucket/run', a place outside"),
        # crashes, time and memory
        'dtype_of_an_inconsistent_state': (lambda l: setattr(l, 'payload', Reduce(np.dtype, 'f8', False, True, state=(3, '<', None, ('x',), {'x': 1}, -1, -1, 0))), 'numpy.dtype makes a state'),
        'set_of_a_gigabyte': (lambda l: setattr(l, 'payload', Reduce(set, Reduce(bytes, 2**30))), 'builtins.bytes with 1 arguments'),
        'size_of_eighty_million': (lambda l: setattr(l, 'payload', Reduce(torch.Size, Reduce(bytes, 80_000_000))), 'builtins.bytes with 1 arguments'),
        'dict_of_colliding_integers': (lambda l: setattr(l, 'payload', {i * (2**61 - 1): 0 for i in range(1, 5000)}), "hashes of integers repeat"),  # every key's hash is 0: a million would take hours
        # what a refusal advises
        'fastcore_run': (lambda l: setattr(l, 'payload', Reduce(importlib.import_module('fastcore.xtras').run, f'touch {marker}')), 'fastcore.xtras.run'),
    }

def test_payloads_of_each_kind(tmp_path):
    "Each payload: refused with a message that names it (and never advises admitting a library's function), or loaded and used with nothing escaping; inspect decides alike; no crash, no time-out"
    marker,victim = tmp_path/'ran',tmp_path/'victim'
    victim.write_text('intact')
    made = {name: (tampered(tmp_path, tmp_path/f'{name}.pkl', change), named) for name,(change,named) in payloads(tmp_path, marker, victim).items()}
    fifo_dir = tmp_path/'fifo'; fifo_dir.mkdir(); os.mkfifo(fifo_dir/'storages')
    with tarfile.open(tmp_path/'tar_with_a_fifo.pkl', 'w') as t: t.add(fifo_dir/'storages', 'storages')  # torch's oldest format: a tar
    made['tar_with_a_fifo'] = (tmp_path/'tar_with_a_fifo.pkl', 'is a tar archive')
    results = {Path(r['file']).stem: r for r in fuzz_exports.run_children(tmp_path, [f for f,_ in made.values()], limit=120, use=True)}
    for name,(f,named) in made.items():
        r = results[name]
        assert r['load'] in ('refused', 'loaded'), (name, r)  # no crash, no time-out, no other error
        assert r['inspect'] == ('refused' if r['load'] == 'refused' else 'admitted'), (name, r)
        assert not r['marker'] and r['victim'] and r['env'] and r['attrs'] and r['hooks'], (name, r)
        if named is None: assert r['load'] == 'loaded' and all(u.split(':')[0] in ('predict', 'get_preds', 'fine_tune', 'lr_find', 'export') for u in r['used']), (name, r)
        else: assert r['load'] == 'refused' and named in r['said'], (name, r)
        assert 'allow=[fastcore' not in r.get('said', '') and 'allow=[posix' not in r.get('said', ''), (name, r)
        assert r['seconds'] < 60 and r['mib'] < 2048, (name, r)
    if 'dispatch_to_rmtree' in results: assert any('UnsafeExportError' in u for u in results['dispatch_to_rmtree']['used']), results['dispatch_to_rmtree']

def test_places_named_by_the_loading_call(tmp_path):
    "A callback's place outside the Learner's folder loads where the loading call names it (`places=`), and is refused where it names another"
    from fastai.callback.tracker import SaveModelCallback
    from ddp_safe_fastai.all import load_learner, UnsafeExportError
    place = f'file://{tmp_path}/elsewhere'
    f = tampered(tmp_path, tmp_path/'export.pkl', lambda l: l.add_cb(SaveModelCallback(fname=place)))
    assert load_learner(f, places=[place]).save_model.fname == place
    with pytest.raises(UnsafeExportError, match=r"places=\['file://"): load_learner(f, places=['s3://another/place'])

def test_a_hook_loaded_keeps_its_own_id(tmp_path):
    "A fastai Hook exported on a model, its handle's id and its key in the module's hooks what the file says: once loaded, torch's `next_id` is not raised to it, its handle removes its own hook, and hooks registered later (whose ids the file may have chosen) never take its place"
    from fastai.callback.hook import Hook, _hook_inner
    from ddp_safe_fastai.all import load_learner
    RemovableHandle = torch.utils.hooks.RemovableHandle
    for hid in (10**18, 10**6):  # past what torch counts to; an id a long-running process hands out
        def change(l):
            l.hook = Hook(l.model, _hook_inner)
            fn = l.model._forward_hooks.pop(l.hook.hook.id)
            l.hook.hook.id = hid; l.model._forward_hooks[hid] = fn
        inf = load_learner(tampered(tmp_path, tmp_path/'export.pkl', change))
        assert RemovableHandle.next_id < 10**6
        seen,counted = [],RemovableHandle.next_id
        if hid == 10**6: RemovableHandle.next_id = hid - 2  # a process that has registered a million hooks: its next ids meet the file's
        for _ in range(6): inf.model.register_forward_hook(lambda m, i, o: seen.append(1))
        inf.model(torch.zeros(1, 4))
        assert seen == [1]*6 and len(inf.model._forward_hooks) == 7, (hid, inf.model._forward_hooks)
        RemovableHandle.next_id = max(RemovableHandle.next_id, counted)
        inf.hook.remove()
        assert len(inf.model._forward_hooks) == 6 and inf.hook.stored is not None

def test_fuzzer(tmp_path):
    "500 mutants of real exports with a fixed seed, each loaded in a child process and used: no disagreement with inspect, no effect, no crash, no time-out"
    results,s = fuzz_exports.fuzz(tmp_path, n=500, seed=0, limit=120, jobs=2)
    assert s['mutants'] == 500, s
    assert s['disagreements'] == 0 and s['effects'] == 0 and s['crashes'] == 0 and s['timeouts'] == 0, s
    assert s['loads'].get('refused', 0) >= 100 and s['loads'].get('loaded', 0) >= 50, s  # mutants of both outcomes: the fuzzer reaches the build too
