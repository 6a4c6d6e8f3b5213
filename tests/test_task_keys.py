"""Which task.* keys each task reads: the declaration in TASKS against what each builder reads, and a key a
task ignores refused where it is set (a study's variant, fixed or base block, `ablate train`)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from sword_fixture import write_module

from ablate.harness.study.validate import StudyError, load_study
from ablate.harness.tasks import build_task
from ablate.schema.config import config_from_tree
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig, ignored_task_keys
from ablate.schema.tasks import TASKS, TOKENIZER_KEYS, TOKENIZERS, tasks_reading

SIZES = {"n_train": 30, "n_valid": 5, "n_test": 5}
PAIRS = [(f"I see {i} cats .", f"Je vois {i} chats .") for i in range(40)]


def recorded_reads(cfg: TaskConfig) -> set[str]:
    """The task.* keys building cfg's task reads: every field the builder gets from it, properties' too."""
    read: set[str] = set()

    class Recording(TaskConfig):
        def __getattribute__(self, name: str):
            if name in TaskConfig.model_fields:
                read.add(name)
            return super().__getattribute__(name)

    recording = Recording(**cfg.model_dump())
    read.clear()  # what validating the new config read
    build_task(recording, 0)
    return read


def generated(name: str, tmp_path, monkeypatch) -> list[TaskConfig]:
    return [TaskConfig(name=name, min_len=5, max_len=6, test_max_len=8, **SIZES)]


def scan(name: str, tmp_path, monkeypatch) -> list[TaskConfig]:
    official = tmp_path / "scan"
    official.mkdir()
    for part in ("train", "test"):
        (official / f"tasks_{part}_length.txt").write_text("IN: jump twice OUT: I_JUMP I_JUMP\n")
    return [TaskConfig(name=name, n_valid=5), TaskConfig(name=name, split="length", path=str(official))]


def parallel(name: str, tmp_path, monkeypatch) -> list[TaskConfig]:
    """A TSV file with BPE, a JSONL file with named language fields, and a hub dataset (load_dataset stood in
    for: no network), which reads task.hf_config."""
    datasets = pytest.importorskip("datasets")
    tsv, jsonl = tmp_path / "pairs.tsv", tmp_path / "pairs.jsonl"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    jsonl.write_text("".join(json.dumps({"en": s, "fr": t}) + "\n" for s, t in PAIRS))
    hub = {"src": [s for s, _ in PAIRS], "tgt": [t for _, t in PAIRS]}
    monkeypatch.setattr(datasets, "load_dataset", lambda path, config: datasets.Dataset.from_dict(hub))
    monkeypatch.chdir(tmp_path)  # `org/pairs` is no folder here: a hub name
    corpus = {"min_tokens": 2, "max_tokens": 5, "max_examples": 20, "n_valid": 4, "n_test": 4}
    return [
        TaskConfig(name=name, path=str(tsv), tokenizer="bpe", bpe_vocab_size=60, **corpus),
        TaskConfig(name=name, path=str(jsonl), src_lang="en", tgt_lang="fr", **corpus),
        TaskConfig(name=name, path="org/pairs", hf_config="en-fr", **corpus),
    ]


def bible(name: str, tmp_path, monkeypatch) -> list[TaskConfig]:
    """Two modules of a tiny SWORD library: Genesis 1 goes to valid, Genesis 2 to train."""
    pytest.importorskip("pysword")
    for module, lang in (("tinyen", "en"), ("tinyes", "es")):
        write_module(tmp_path, module, lang, {("Genesis", c, v): f"{lang} {c} {v} ." for c in (1, 2)
                                              for v in (1, 2)})  # fmt: skip
    corpus = {"min_tokens": 2, "max_tokens": 5, "max_examples": 20, "n_valid": 4, "n_test": 4}
    return [TaskConfig(name=name, path=str(tmp_path), src_lang="tinyen", tgt_lang="tinyes", tokenizer="bpe",
                       bpe_vocab_size=60, **corpus)]  # fmt: skip


def one_bible(name: str, tmp_path, monkeypatch, max_tokens: int = 2) -> list[TaskConfig]:
    """One module of a tiny SWORD library (bible_lm, bible_genre): Genesis 1-11, so chapter 11 is test text."""
    pytest.importorskip("pysword")
    write_module(tmp_path, "tinyen", "en", {("Genesis", c, v): f"en {c} {v} ." for c in range(1, 12)
                                            for v in (1, 2)})  # fmt: skip
    return [TaskConfig(name=name, path=str(tmp_path), src_lang="tinyen", tokenizer="bpe", bpe_vocab_size=60,
                       max_tokens=max_tokens, max_examples=20, n_valid=4, n_test=4)]  # fmt: skip


# Each task -> the configurations that drive its builder down every branch that reads a key; a task added to
# TASKS fails below until it has its entry.
CASES = {"copy": generated, "reverse": generated, "sort": generated, "addition": generated,
         "recall": generated, "cues": generated, "digits": generated, "synth_mt": generated, "scan": scan,
         "parallel": parallel,
         "bible": bible, "bible_lm": one_bible,
         "bible_genre": lambda *case: one_bible(*case, max_tokens=6)}  # a verse of 4 words  # fmt: skip


@pytest.mark.parametrize("name", TASKS)
def test_each_builder_reads_exactly_the_keys_its_task_declares(name, tmp_path, monkeypatch):
    declared = {"name", *TASKS[name].keys()}
    read = set()
    for cfg in CASES[name](name, tmp_path, monkeypatch):
        reads = recorded_reads(cfg)
        assert reads <= declared, f"{name} reads undeclared {sorted(reads - declared)}"
        read |= reads
    assert read == declared, f"{name} declares keys it never reads: {sorted(declared - read)}"


def test_every_task_key_is_read_by_some_task():
    assert [key for key in TaskConfig.model_fields if key not in ("name", "plugin") and not tasks_reading(key)] == []


def tokens(data) -> dict:
    return {split: [(ex.src, ex.tgt) for ex in examples] for split, examples in data.splits.items()}


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_a_key_only_another_tokenizer_reads_changes_no_token(kind, tmp_path):
    """corpus_task hands every tokenizer bpe_vocab_size (recorded as read above): the tokenizers that do not
    read it make the same tokens whatever its value."""
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    cfg = TaskConfig(name="parallel", path=str(path), tokenizer=kind)
    others = [key for key, kinds in TOKENIZER_KEYS.items() if kind not in kinds]
    assert set(ignored_task_keys(cfg)) & set(TOKENIZER_KEYS) == set(others)
    for key in others:
        changed = cfg.model_copy(update={key: getattr(cfg, key) + 7})
        assert tokens(build_task(changed, 0)) == tokens(build_task(cfg, 0)), key


# A valid value other than the default for every TaskConfig key; a new key fails the test until it has one.
VALUES = {"min_len": 2, "max_len": 12, "test_max_len": 30, "vocab_size": 7, "n_train": 9, "n_valid": 9,
          "n_test": 9, "split": "length", "path": "corpus.tsv", "tokenizer": "char", "bpe_vocab_size": 99,
          "src_lang": "en", "tgt_lang": "fr", "hf_config": "en-fr", "min_tokens": 2, "max_tokens": 40, "long_after": 30,
          "max_examples": 9, "train_factor": 2}  # fmt: skip
TOGETHER = {"src_lang": "tgt_lang", "tgt_lang": "src_lang"}  # keys given only with another
# Each task, with each tokenizer where it reads one (bpe_vocab_size is read with bpe only).
CONFIGURED = [(name, kind) for name, task in TASKS.items()
              for kind in (TOKENIZERS if "tokenizer" in task.reads else [None])]  # fmt: skip


def model(task: str) -> dict:
    """The model keys a task can run with: a classifier for a task whose target is one label."""
    return {"arch": "classifier"} if TASKS[task].labelled else {}


def problems(path, sets: dict | None = None) -> list[str]:
    """The study's problems (with `ablate sweep --set` keys): none when it loads."""
    try:
        load_study(path, sets=sets, read_data=False)
    except StudyError as e:
        return e.lines
    return []


@pytest.mark.parametrize("block", ["variants", "fixed", "base"])
@pytest.mark.parametrize("name, tokenizer", CONFIGURED)
def test_a_task_key_is_refused_where_it_is_set_when_its_task_ignores_it(name, tokenizer, block, tmp_path):
    # The task, its tokenizer, and the keys it cannot run without (TASKS' `needs`).
    chosen = {"name": name, **({"tokenizer": tokenizer} if tokenizer else {}),
              **{key: VALUES[key] for key in TASKS[name].needs}}  # fmt: skip
    reads = {*chosen, *TASKS[name].reads, *(TOKENIZERS[tokenizer] if tokenizer else ())}
    where = {"variants": "variants.a", "fixed": "fixed", "base": "base"}[block]
    for key in TaskConfig.model_fields.keys() - chosen.keys() - {"plugin"}:  # plug-ins' settings: test_plugins
        setting = {k: VALUES[k] for k in (key, TOGETHER.get(key)) if k}
        tree = {"name": "keys", "base": {"task": dict(chosen), "model": model(name)}, "variants": {"a": {}}}
        if block == "base":
            tree["base"]["task"].update(setting)
        else:
            dotted = {f"task.{k}": v for k, v in setting.items()}
            tree.update({"variants": {"a": dotted}} if block == "variants" else {"fixed": dotted})
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(tree))
        refused = sorted(k for k in setting if k not in reads)
        lines = [line.partition(" (")[0] for line in problems(path)]
        assert lines == [f"{path}: {where}.task.{k}: has no effect" for k in refused], key
        train = {"task": {**chosen, **setting}, "model": model(name)}  # `ablate train` and ablate.train
        if refused:
            with pytest.raises(ConfigError) as e:
                config_from_tree(train, {})
            assert [(k, msg.partition(" (")[0]) for k, msg in e.value.problems] == [
                (f"task.{k}", "has no effect") for k in refused
            ], key
        else:
            assert config_from_tree(train, {}).task.name == name


def study_lines(tmp_path, sets: dict | None = None, **tree) -> list[str]:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "keys", **tree}))
    return [line.removeprefix(f"{path}: ") for line in problems(path, sets)]


def test_the_issues_cases_say_which_task_reads_the_key(tmp_path):
    copy, reverse = {"task": {"name": "copy"}}, {"task": {"name": "reverse"}}
    corpus = {"task": {"name": "parallel", "path": "x.tsv", "bpe_vocab_size": 8}}
    assert study_lines(tmp_path, base=copy, variants={"a": {"task.split": "length"}}) == [
        "variants.a.task.split: has no effect (a setting of task scan; task.name is copy)"
    ]
    assert study_lines(tmp_path, base=reverse, fixed={"task.path": "x.tsv"}) == [
        "fixed.task.path: has no effect (a setting of tasks scan, parallel, bible, bible_genre, bible_lm; task.name "
            "is reverse)"
    ]
    assert study_lines(tmp_path, {"task.n_train": 9}, base={"task": {"name": "scan"}}) == [
        "--set task.n_train: has no effect (a setting of tasks copy, reverse, sort, addition, recall, cues, "
        "digits, synth_mt; task.name is scan)"
    ]
    assert study_lines(tmp_path, base=corpus) == [
        "base.task.bpe_vocab_size: has no effect (acts only with tokenizer bpe; task.tokenizer is word)"
    ]
    with pytest.raises(ConfigError, match=r"^task.max_len: has no effect \(a setting of tasks copy, reverse, "
                                          r"sort, addition, recall, cues, digits, synth_mt; task.name is scan\)$"):  # fmt: skip
        config_from_tree({}, {"task.name": "scan", "task.max_len": 5})


def test_a_shared_task_key_is_refused_only_when_no_variant_reads_it(tmp_path):
    grid = {"task.name": ["copy", "scan"]}
    assert study_lines(tmp_path, factors=grid, fixed={"task.split": "length", "task.vocab_size": 5}) == []
    assert study_lines(tmp_path, factors=grid, fixed={"task.bpe_vocab_size": 5}) == [
        "fixed.task.bpe_vocab_size: has no effect (a setting of tasks parallel, bible, bible_genre, bible_lm; "
            "task.name is copy)"
    ]
    advice = "list the variants by name to leave it out where it does nothing"
    assert study_lines(tmp_path, factors={**grid, "task.split": ["simple", "length"]}) == [
        "factors.task.split: has no effect in 'name=copy,split=simple', 'name=copy,split=length' "
        f"(a setting of task scan; task.name is copy); {advice}"
    ]


def data_refusal(tmp_path, name: str, **task) -> list[str]:
    """The lines load_study refuses a one-variant study of task `name` with, its data read."""
    needed = {"max_tokens": 16} if "max_tokens" in TASKS[name].needs else {}
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "seeds": [0], "metric": {"name": "test/loss", "direction": "minimize"},
        "base": {"preset": "transformer", "task": {"name": name, **needed, **task}, "model": model(name)},
        "variants": {"a": {}},
    }))  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        load_study(study, read_data=True)
    return str(refused.value).splitlines()


@pytest.mark.parametrize("name", [name for name, task in TASKS.items() if "path" in task.reads])
def test_every_task_that_reads_this_machine_is_checked_for_it_before_the_study_exists(tmp_path, name):
    # However the task is named and whatever it reads (a corpus, the SWORD modules, SCAN's files): data it
    # cannot find is one problem naming task.path, found by load_study, before any storage or trial exists.
    missing = tmp_path / "nothing-here"
    lines = data_refusal(tmp_path, name, path=str(missing))
    assert len(lines) == 1 and "task.path" in lines[0] and str(missing) in lines[0], lines
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_a_task_declares_what_it_reads_from_this_machine():
    assert {name for name, task in TASKS.items() if task.reads_machine == "always"} == {
        "bible", "bible_genre", "bible_lm", "digits"
    }
    assert {name for name, task in TASKS.items() if task.reads_machine == "path"} == {"scan", "parallel"}


def test_digits_without_scikit_learn_is_refused_up_front(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # an import fails as if it were not installed
    lines = data_refusal(tmp_path, "digits")
    assert len(lines) == 1 and "task.name: digits reads scikit-learn" in lines[0], lines
    assert "pip install 'attention-ablate[digits]'" in lines[0]


@pytest.mark.parametrize("name", [name for name, task in TASKS.items() if name.startswith("bible")])
def test_a_task_whose_default_data_is_missing_is_refused_up_front(tmp_path, monkeypatch, name):
    # The Bibles' default library ($SWORD_PATH) without the modules: as `ablate sweep bible-lm` on a machine
    # without Debian's Bibles, refused in one line rather than run to failed trials.
    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    lines = data_refusal(tmp_path, name)
    assert len(lines) == 1 and "task.name" in lines[0] and "sword" in lines[0].lower(), lines
