# PEFT itself, as the reference for ferry's adapters: for each job, loads a base model directory
# with transformers, puts a PEFT adapter on it, and prints the log-probabilities of the given tokens
# (every position's next token); also those with the adapter disabled and of a merged model
# directory, and saves the adapter again (PEFT's own save) into a directory of its own, for ferry
# to read back. One process for every job: torch loads once.
# usage: python3 peft-reference.py JOBS_JSON TOKENS_JSON
#   JOBS_JSON: {"<name>": {"base": DIR, "adapter": DIR, "merged": DIR, "resaved": DIR}, ...}
# prints: {"<name>": {"adapter": [[...]], "base": [[...]], "merged": [[...]]}, ...}
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

jobs = json.loads(sys.argv[1])
tokens = torch.tensor(json.loads(sys.argv[2]), dtype=torch.long)


def logprobs(model):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    lp = torch.log_softmax(logits[:, :-1, :], dim=-1)
    return lp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()


out = {}
for name, job in jobs.items():
    base = AutoModelForCausalLM.from_pretrained(job["base"], torch_dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, job["adapter"])
    with_adapter.eval()
    out[name] = {"adapter": logprobs(with_adapter)}
    with_adapter.save_pretrained(job["resaved"])
    with with_adapter.disable_adapter():
        out[name]["base"] = logprobs(with_adapter)
    merged = AutoModelForCausalLM.from_pretrained(job["merged"], torch_dtype=torch.float32)
    merged.eval()
    out[name]["merged"] = logprobs(merged)
print(json.dumps(out))
