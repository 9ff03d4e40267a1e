"""Every config composes with Hydra's compose API, and every component that builds offline in milliseconds is
built from it (lightning-hydra-template's tests/test_configs.py). Models, datasets and servers only
compose."""

from __future__ import annotations

import importlib.util
from functools import cache, partial

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tracer.build import (
    CONFIG_DIR,
    build,
    build_dataset,
    build_executor,
    build_scorer,
    load_config,
    names,
)
from tracer.core.context import ContextRendering
from tracer.data import write_native
from tracer.data.pool import apply_preset
from tracer.executors import OracleExecutor
from tracer.scorer_base.protocol import Scorer

GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name != "experiment")
OPTIONS = [(g, o) for g in GROUPS for o in names(g)]
TABLE, ABLATION = names("experiment/bfcl_table"), names("experiment/tracer_plus_ablation")
# the rows of the deleted scripts/ablate_tracer_plus.sh: each row's command-line overrides, as it ran them
PAPER = ["window=all", "results=truncated"]
SCRIPT_ROWS = {
    "full": [], "toolnet": ["scorer=toolnet"], "tracer": ["scorer=tracer"], "vector": ["scorer=vector"],
    "only_prefix": ["scorer.keys=[prefix]"],
    "no_prefix": ["scorer.keys=[last_2+cross_turn,last_1+cross_turn]"],
    "no_last2": ["scorer.keys=[prefix,last_1+cross_turn]"],
    "no_last1": ["scorer.keys=[prefix,last_2+cross_turn]"],
    "no_vector": ["scorer.vector_candidates=0"], "mlp": ["scorer.model=mlp"],
    **{f"drop_{g}": [f"scorer.features.drop=[{g}]"]
       for g in ("member", "log_p", "log_r", "edge_cos", "state", "vector", "tool", "history")},
    "drop_tool_history": ["scorer.features.drop=[tool,history]"],
    "query_all": [f"scorer.query_context.{o}" for o in PAPER],
    "memory_all": [f"scorer.memory_context.{o}" for o in PAPER],
    "both_all": [f"scorer.{c}.{o}" for c in ("query_context", "memory_context") for o in PAPER],
    "query_user": ["scorer.query_context.calls=none"], "memory_user": ["scorer.memory_context.calls=none"],
    "no_join_users": ["scorer.query_context.join_users=false", "scorer.memory_context.join_users=false"],
    "vector_join_users": ["scorer=vector", "+scorer.context.join_users=true"],
}
REFERENCE_ROWS = {"full", "toolnet", "tracer", "vector"}  # latency was timed for these only


@pytest.fixture(scope="module", autouse=True)
def hydra_configs():
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        yield


@cache
def evaluate(*overrides: str):
    """The composed evaluate.yaml (read-only: shared between tests)."""
    cfg = compose("evaluate", overrides=list(overrides), return_hydra_config=True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def importable(target: str) -> bool:
    """The ``_target_``'s module exists (found without importing it: the encoders' modules load heavy
    libraries)."""
    module, _, _ = target.rpartition(".")
    return importlib.util.find_spec(module) is not None


def test_config_dir_ships_inside_the_package_and_the_root_link_points_at_it():
    assert CONFIG_DIR.parent.name == "tracer" and (CONFIG_DIR / "evaluate.yaml").is_file()
    assert (CONFIG_DIR.parents[1] / "configs").resolve() == CONFIG_DIR


@pytest.mark.parametrize("name", ["evaluate", "train"])
def test_entry_configs_compose_and_their_cheap_parts_build(name):
    cfg = compose(name, return_hydra_config=True)
    OmegaConf.resolve(cfg)     # every interpolation resolves (paths, hydra dirs)
    assert cfg.hydra.run.dir.startswith(cfg.paths.outputs + "/")
    scorer = build_scorer(cfg.scorer)
    assert isinstance(scorer, Scorer)
    assert importable(cfg.dataset._target_) and importable(cfg.embedder._target_)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes(group, option):
    cfg = evaluate(f"{group}={option}")
    node = cfg[group]
    if "_target_" in node:  # models, datasets and servers are not loaded here
        assert importable(node._target_)
    if group == "scorer":
        scorer = build_scorer(node)
        assert isinstance(scorer, Scorer) and scorer.name == option
        # the YAML alone (plain-Python use) is the same config Hydra composes
        assert load_config("scorer", option) == node
    if group == "registry":
        preset = build(node)
        assert isinstance(preset, partial) and preset.func is apply_preset
    if group == "executor" and option == "oracle":
        assert isinstance(build_executor(node), OracleExecutor)


# options whose defaults list names other configs of their own group (dataset=jsonl's overrides another group:
# it composes only inside evaluate.yaml or train.yaml)
WITH_DEFAULTS = [(g, o) for g, o in OPTIONS
                 if all(isinstance(d, str)
                        for d in OmegaConf.load(CONFIG_DIR / g / f"{o}.yaml").get("defaults", [0]))]


@pytest.mark.parametrize("group,option", WITH_DEFAULTS, ids=[f"{g}={o}" for g, o in WITH_DEFAULTS])
def test_plain_python_loading_is_the_node_evaluate_py_composes(group, option):
    cfg = evaluate(f"{group}={option}")
    node = OmegaConf.to_container(cfg[group], resolve=True)
    assert load_config(group, option, **({"seed": cfg.seed} if "seed" in node else {})) == node


def test_scorer_renderings_are_plain_mappings_the_constructor_validates():
    for option in names("scorer"):
        scorer = build_scorer(option)
        # rendering: what embed() embeds (None: the scorer embeds nothing there); query: bm25's text query
        found = [getattr(scorer, a) for a in ("rendering", "query_rendering", "memory_rendering", "query")
                 if getattr(scorer, a, None) is not None]
        assert found and all(isinstance(r, ContextRendering) for r in found), option
    with pytest.raises(Exception, match="window"):
        build_scorer("vector", context={"window": "nowhere"})


def test_paths_are_overridable_from_the_command_line():
    cfg = evaluate("dataset=tau2", "paths.datasets=/data/tools", "paths.cache=/scratch/c")
    assert cfg.dataset.path == "/data/tools/tau2" and cfg.embedder.cache_dir == "/scratch/c/embeddings"


def test_jsonl_dataset_builds_from_its_config(tmp_path, tiny_registry, tiny_trajs):
    write_native(tmp_path / "ds", tiny_registry, tiny_trajs)
    cfg = evaluate("dataset=jsonl", f"dataset.path={tmp_path / 'ds'}")
    assert cfg.registry.preset is None    # dataset=jsonl brings its own registry
    ds = build_dataset(cfg.dataset, cfg.registry, seed=0)
    assert ds.trajectories == tuple(tiny_trajs) and ds.registry.names == tiny_registry.names


def test_openai_executor_builds_offline_with_a_model_named():
    ex = build_executor(evaluate("executor=openai", "executor.model=m").executor)
    assert ex.model == "m"


def test_every_experiment_is_in_a_glob_sweep():
    loader = GlobalHydra.instance().config_loader()
    assert loader.get_group_options("experiment/tracer_plus_ablation") == sorted(SCRIPT_ROWS)
    # the cascade needs two trained encoders (encoder_training=cascade): its rows are the encoder frontier's
    assert TABLE == [n for n in names("scorer") if n != "cascade"]


@pytest.mark.parametrize("row", TABLE)
def test_table_experiment(row):
    cfg = evaluate(f"experiment=bfcl_table/{row}")
    assert (cfg.dataset.name, cfg.registry.preset, cfg.k, cfg.folds, cfg.seed) == ("bfcl", "large", 5, 5, 0)
    assert cfg.regime.name == "teacher_forcing" and cfg.executor._target_.endswith("OracleExecutor")
    assert cfg.hydra.sweep.subdir == f"bfcl_table/{row}"
    assert cfg.scorer == evaluate(f"scorer={row}").scorer
    assert build_scorer(cfg.scorer).name == row


@pytest.mark.parametrize("row", ABLATION)
def test_ablation_experiment_is_the_script_row(row):
    cfg = evaluate(f"+experiment/tracer_plus_ablation={row}")
    group = [o for o in SCRIPT_ROWS[row] if o.startswith("scorer=")]
    script = OmegaConf.to_container(evaluate(*(group or ["scorer=tracer_plus"])).scorer)
    # the script's other overrides, parsed as Hydra parses a command line, applied to the composed scorer
    for o in OverridesParser.create().parse_overrides([o for o in SCRIPT_ROWS[row] if o not in group]):
        node, key = script, o.key_or_group.split(".")[1:]
        for part in key[:-1]:
            node = node[part]
        node[key[-1]] = o.value()
    assert OmegaConf.to_container(cfg.scorer) == script
    assert (cfg.dataset.name, cfg.registry.preset, cfg.k, cfg.folds, cfg.seed) == ("bfcl", "large", 5, 5, 0)
    assert cfg.latency_sample == (50 if row in REFERENCE_ROWS else 0)
    assert cfg.hydra.sweep.subdir == f"tracer_plus_ablation/{row}"
    assert isinstance(build_scorer(cfg.scorer), Scorer)


@pytest.mark.parametrize("recipe", names("encoder_training"))
def test_every_encoder_training_recipe_is_a_typed_recipe(recipe):
    """A recipe is checked when it is read (EncoderRecipe.from_config: its keys, kind, layers, context weight,
    slow stage), before any training: every shipped recipe passes, and the students cut MiniLM to the layers
    their files name."""
    from tracer.learn.encoders import EncoderRecipe

    cfg = OmegaConf.to_container(evaluate(f"encoder_training={recipe}").encoder_training, resolve=True)
    r = EncoderRecipe.from_config(cfg)
    assert r.train.layers == {"mnrl_l3_int8": (0, 1, 5), "mnrl_l3_cut_int8": (0, 1, 5)}.get(recipe, ())
    assert r.train.from_teacher == (recipe == "mnrl_l3_cut_int8")
    assert (r.kind == "static") == (recipe.startswith("static") or recipe == "cascade")
    assert r.train.context_weight == (0.5 if recipe in ("static_contexts", "cascade") else 0.0)
    assert (r.slow is not None) == (recipe == "cascade")
    # its fast stage is the fastest preset's encoder, its slow stage mnrl_int8's (one cache key)
    if recipe == "cascade":
        for stage, name in ((r, "static_contexts"), (r.slow, "mnrl_int8")):
            alone = OmegaConf.to_container(evaluate(f"encoder_training={name}").encoder_training,
                                           resolve=True)
            alone = EncoderRecipe.from_config(alone)
            assert (stage.train, stage.serve_as, stage.kind) == (alone.train, alone.serve_as, alone.kind)
        assert r.inner_encoders and not r.slow.inner_encoders


def test_a_recipe_names_the_key_it_refuses():
    from tracer.learn.encoders import EncoderRecipe

    cfg = OmegaConf.to_container(evaluate("encoder_training=mnrl").encoder_training, resolve=True)
    with pytest.raises(ValueError, match=r"encoder_training.distill: not a recipe key; the keys are .*batch"):
        EncoderRecipe.from_config({**cfg, "distill": 1.0})
    with pytest.raises(ValueError, match="encoder_training.slow.negatives: not a recipe key"):
        EncoderRecipe.from_config({**cfg, "slow": {**cfg, "negatives": "trie"}})
    with pytest.raises(ValueError, match="encoder_training.kind must be one of transformer, static, got 't"):
        EncoderRecipe.from_config({**cfg, "kind": "table"})
    with pytest.raises(ValueError, match="encoder_training.layers must be distinct"):
        EncoderRecipe.from_config({**cfg, "layers": [1, 1]})
    with pytest.raises(ValueError, match="kind 'static' has no layers"):
        EncoderRecipe.from_config({**cfg, "kind": "static", "layers": [0]})
    with pytest.raises(ValueError, match="encoder_training.epochs must be int, got '2'"):
        EncoderRecipe.from_config({**cfg, "epochs": "2"})
    with pytest.raises(ValueError, match="encoder_training.inner_encoders must be bool, got 1"):
        EncoderRecipe.from_config({**cfg, "inner_encoders": 1})


EXPERIMENTS = CONFIG_DIR.parents[1] / "experiments" / "configs"


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (EXPERIMENTS / "encoder_training").glob("*.yaml")))
def test_archived_recipes_compose_through_the_search_path(recipe):
    """experiments/configs/encoder_training/ holds recipes no preset uses; they build on the library's through
    Hydra's search path (the command each file opens with) and are still recipes the trainers accept."""
    from tracer.learn.encoders import EncoderRecipe

    cfg = evaluate(f"hydra.searchpath=[file://{EXPERIMENTS}]", f"encoder_training={recipe}").encoder_training
    r = EncoderRecipe.from_config(OmegaConf.to_container(cfg, resolve=True))
    assert r.kind == "transformer"
    assert r.train.layers == {"mnrl_l2_int8": (4, 5), "mnrl_l4_int8": (0, 1, 4, 5)}.get(recipe, ())
