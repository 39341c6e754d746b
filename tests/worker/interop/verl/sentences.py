"""Keys and warning sentences the verl interop tests assert, written once."""

ACTOR_ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"
NEEDS_PLUS = "verl needs +{}: the key is not in its default config; the export adds the +"
PASSED = "passed through to verl, not run by attnboard: {}"
PLACEHOLDER = "skipped placeholder [other parameters...]"
