"""Turn a policy into what serving engines read: SGLang's --deepep-config, vLLM's flags and env."""
