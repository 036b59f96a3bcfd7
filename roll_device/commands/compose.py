"""Compose the Hydra configuration once, outside `@hydra.main` (for every command and the tests).

The config tree lives in `configs/` at the repository root; `ROLL_DEVICE_CONFIG_DIR` points
elsewhere. Overrides use Hydra's syntax (`key=value`, `+new.key=value`, `group=option`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig

from roll_device.errors import ConfigError

CONFIG_NAME = "config"
NO_SUCH_OPTION = re.compile(
    r"Could not find '([^']+)/([^']+)'\s+Available options in '[^']+':\n((?:\t.*\n)+)"
)
NO_SUCH_KEY = re.compile(r"Could not override '([^']+)'\.\s+To append to your config use (\+\S+)")


def config_dir() -> Path:
    configured = os.environ.get("ROLL_DEVICE_CONFIG_DIR")
    path = Path(configured) if configured else Path(__file__).resolve().parents[2] / "configs"
    if not (path / f"{CONFIG_NAME}.yaml").exists():
        raise ConfigError(
            f"no {CONFIG_NAME}.yaml in {path}: set ROLL_DEVICE_CONFIG_DIR to the configs/ folder "
            "of a roll-device checkout"
        )
    return path


def compose(overrides: list[str] | None = None, with_hydra: bool = False) -> DictConfig:
    """The composed configuration for `overrides` (with the `hydra` node when `with_hydra`: the
    run directory), or a ConfigError naming the bad override."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(
                config_name=CONFIG_NAME, overrides=list(overrides or []), return_hydra_config=with_hydra
            )
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(explain(exc)) from exc


def explain(exc: Exception) -> str:
    """One line for a failed composition. An override of a key the config lacks names the key and
    both ways on (Hydra's own report only offers to add it); an unknown option of a config group
    names the options; anything else is Hydra's report."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    text = str(exc)
    unknown, missing = NO_SUCH_KEY.search(text), NO_SUCH_OPTION.search(text)
    if unknown and isinstance(exc.__cause__, (ConfigKeyError, ConfigAttributeError)):
        key, append = unknown.groups()
        full_key = re.sub(r"\[(\d+)\]", r".\1", exc.__cause__.full_key or key)  # nodes[0] -> nodes.0
        add = append if full_key == key else f"+{full_key}=VALUE"
        try:
            defaults = compose([])
        except ConfigError:
            defaults = None  # no default configuration to compare with: no suggestion
        near = close_keys(full_key, defaults) if defaults is not None else []
        meant = f"did you mean {' or '.join(near)}? " if near else ""
        owners = options_with_key(full_key)
        if owners:
            return (
                f"{full_key} is not a key of this configuration but of {' and '.join(owners)}: choose "
                f"{owners[0]} to set it"
            )
        new = (
            f"; a new key is added with {add}"
            if defaults is not None and _takes_new(full_key, defaults)
            else ""
        )
        return f"{full_key} is not a key of the configuration: {meant}`roll-device run --cfg job` prints every key{new}"
    if missing:
        group, option, options = missing.groups()
        return f"{group}={option}: no such option; choose one of {', '.join(options.split())}"
    return f"bad configuration or override: {one_line(text)}"


def _takes_new(key: str, defaults: DictConfig) -> bool:
    """Whether `+key=...` would be read (in an open section or a free mapping of the `defaults`
    configuration's sections), so that the hint to add it leads somewhere."""
    from roll_device.pipeline.config import accepts_new_key

    return accepts_new_key(key, {"trainer": defaults.trainer.name, "rollout": defaults.rollout.name})


def options_with_key(key: str) -> list[str]:
    """`group=option` for each option of the config group `key` starts with whose file has the
    rest of `key` (`cluster.runtime_env` -> `cluster=remote`)."""
    import yaml

    group, _, rest = key.partition(".")
    found = []
    for path in sorted((config_dir() / group).glob("*.yaml")) if rest else []:
        node = yaml.safe_load(path.read_text())
        for part in rest.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is not KeyError:
            found.append(f"{group}={path.stem}")
    return found


def close_keys(key: str, defaults: DictConfig) -> list[str]:
    """Keys of the `defaults` configuration that `key` may have meant: the same last part elsewhere
    (`rollout.temperature` -> `algorithm.temperature`), else a near spelling."""
    from difflib import get_close_matches

    from omegaconf import OmegaConf

    known = list(_dotted(OmegaConf.to_container(defaults, resolve=False)))
    known = [k for k in known if not key.startswith(f"{k}.")]  # not the key's own parents
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
    return same_leaf or get_close_matches(key, known, n=2, cutoff=0.8)


def _dotted(tree: dict, prefix: str = ""):
    for name, value in tree.items():
        yield f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{name}.")


def one_line(message: str) -> str:
    """Hydra's and OmegaConf's multi-line reports as one line."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())
