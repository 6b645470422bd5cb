"""One typed config tree, loaded from TOML with SPADE__SECTION__KEY env-var overrides.

An unknown or ill-typed key is a ConfigError naming the key and the file; nothing here
touches the network or starts processes. One module per group of sections; this package
exposes the API the rest of the code imports (the trainer's and the corpus's sections are
imported from their own modules, spade_async.core.config.trainer and .corpus).
"""

from spade_async.core.config.daemon import DaemonConfig
from spade_async.core.config.endpoints import (
    EndpointConfig,
    PoolConfig,
    VllmLoraSwap,
    VllmNcclSwap,
    VllmReloadSwap,
)
from spade_async.core.config.errors import ConfigError
from spade_async.core.config.load import load_config
from spade_async.core.config.rollout import RegretConfig, RolloutConfig
from spade_async.core.config.root import (
    ModelConfig,
    PathsConfig,
    RetentionConfig,
    SpadeConfig,
    checkpoint_dir,
    logprobs_mode,
    memory_config,
    run_dir,
)
from spade_async.core.config.sandbox import SandboxConfig, ValidationConfig

__all__ = [
    "ConfigError",
    "DaemonConfig",
    "EndpointConfig",
    "ModelConfig",
    "PathsConfig",
    "PoolConfig",
    "RegretConfig",
    "RetentionConfig",
    "RolloutConfig",
    "SandboxConfig",
    "SpadeConfig",
    "ValidationConfig",
    "VllmLoraSwap",
    "VllmNcclSwap",
    "VllmReloadSwap",
    "checkpoint_dir",
    "load_config",
    "logprobs_mode",
    "memory_config",
    "run_dir",
]
