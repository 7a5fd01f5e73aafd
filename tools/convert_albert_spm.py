#!/usr/bin/env python3
"""Convert the ALBERT SentencePiece Unigram model (30k-clean.model) to a Hugging Face tokenizer.json and write
goldens for it with the Hugging Face `tokenizers` library, in the same JSONL format as the shared goldens
({"text", "add_special_tokens", "ids", "tokens", "decoded", "decoded_skip_special"}).

Runs where transformers, sentencepiece, protobuf and tokenizers are installed (the H200 machine):
    python3 tools/convert_albert_spm.py --model 30k-clean.model --inputs golden_inputs.json --out DIR
Writes DIR/tokenizer.json, DIR/golden_hf_tokenizers_<version>.jsonl and DIR/conversion.json (versions, checks).
"""
import argparse, json, os, sys


def convert(model_path):
    """tokenizers.Tokenizer for the spm model, via transformers' own slow->fast converter."""
    import transformers
    errors = []
    try:  # transformers 5: the converter reads the .model through sentencepiece's protobuf
        from transformers.convert_slow_tokenizer import AlbertConverter

        class _Slow:  # the converter only needs vocab_file and the normalisation flags of AlbertTokenizer
            vocab_file = model_path
            do_lower_case = True
            keep_accents = False
            remove_space = True
            def __init__(self):
                import sentencepiece as spm
                self.sp_model = spm.SentencePieceProcessor(model_file=model_path)
            def convert_tokens_to_ids(self, t):
                return self.sp_model.piece_to_id(t)
        return AlbertConverter(_Slow()).converted(), "AlbertConverter"
    except Exception as e:  # noqa: BLE001
        errors.append(f"AlbertConverter: {e!r}")
    try:
        tok = transformers.AlbertTokenizerFast(vocab_file=model_path)
        return tok.backend_tokenizer, "AlbertTokenizerFast"
    except Exception as e:  # noqa: BLE001
        errors.append(f"AlbertTokenizerFast: {e!r}")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(model_path), tokenizer_type="albert")
        return tok.backend_tokenizer, "AutoTokenizer"
    except Exception as e:  # noqa: BLE001
        errors.append(f"AutoTokenizer: {e!r}")
    sys.exit("conversion failed:\n  " + "\n  ".join(errors))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import tokenizers, transformers
    os.makedirs(a.out, exist_ok=True)
    tok, how = convert(os.path.abspath(a.model))
    path = os.path.join(a.out, "tokenizer.json")
    tok.save(path)
    tok = tokenizers.Tokenizer.from_file(path)  # goldens from the file as saved, exactly what berth reads
    inputs = json.load(open(a.inputs))
    gold = os.path.join(a.out, f"golden_hf_tokenizers_{tokenizers.__version__}.jsonl")
    n = 0
    with open(gold, "w") as f:
        for text in inputs:
            for add in (False, True):
                enc = tok.encode(text, add_special_tokens=add)
                ids = list(enc.ids)
                f.write(json.dumps({"text": text, "add_special_tokens": add, "ids": ids, "tokens": list(enc.tokens),
                                    "decoded": tok.decode(ids, skip_special_tokens=False),
                                    "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)},
                                   ensure_ascii=False) + "\n")
                n += 1
    # Sanity: the converted tokenizer agrees with sentencepiece itself on plain lower-case ASCII.
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=a.model)
    probe = "hello world, this is a test."
    same = sp.encode(probe) == tok.encode(probe, add_special_tokens=False).ids
    meta = {"converter": how, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "goldens": n, "agrees_with_sentencepiece_on_probe": same}
    json.dump(meta, open(os.path.join(a.out, "conversion.json"), "w"), indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
