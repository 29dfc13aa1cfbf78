# PEFT itself, as the reference for ferry's adapters: loads a base model directory with
# transformers, puts a PEFT adapter on it, and prints the log-probabilities of the given tokens
# (every position's next token) as JSON; also those of a merged model directory, and saves the
# adapter again (PEFT's own save) into a directory of its own, for ferry to read back.
# usage: python3 peft-reference.py BASE_DIR ADAPTER_DIR MERGED_DIR RESAVE_DIR TOKENS_JSON
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base_dir, adapter_dir, merged_dir, resave_dir, tokens_json = sys.argv[1:6]
tokens = torch.tensor(json.loads(tokens_json), dtype=torch.long)


def logprobs(model):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    lp = torch.log_softmax(logits[:, :-1, :], dim=-1)
    return lp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()


base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
with_adapter = PeftModel.from_pretrained(base, adapter_dir)
with_adapter.eval()
out = {"adapter": logprobs(with_adapter)}
with_adapter.save_pretrained(resave_dir)
with with_adapter.disable_adapter():
    out["base"] = logprobs(with_adapter)
merged = AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32)
merged.eval()
out["merged"] = logprobs(merged)
print(json.dumps(out))
