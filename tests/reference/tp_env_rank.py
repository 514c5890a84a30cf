"""A script as a user would run it on every rank with torchrun, for
tests/runtime/test_tensor_parallel_faults.py (no ``__main__`` guard, on purpose):

    torchrun --nproc-per-node 2 tests/reference/tp_env_rank.py MODEL_DIR OUT PROMPTS_JSON

Every rank builds the same ``ssd.LLM`` with tensor_parallel_init "env"; on
rank 1 the constructor follows rank 0 and exits the process; rank 0 generates
greedily for the prompts (a JSON list of token-id lists) and writes the token
ids to OUT (JSON).
"""
import json
import sys

from ssd import LLM, SamplingParams


llm = LLM(sys.argv[1], tensor_parallel_size=2, tensor_parallel_init="env", max_model_len=64)
outs = llm.generate(json.loads(sys.argv[3]), SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
with open(sys.argv[2], "w") as f:
    json.dump([o.token_ids for o in outs], f)
llm.shutdown()
