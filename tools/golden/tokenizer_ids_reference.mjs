// Makes tests/fixtures/tokenizer_ids.json from implementations independent of hadatrain's: npm
// @huggingface/transformers (the JS port of Hugging Face tokenizers) for Llama 3 and Debian's spm_encode for
// Llama 2. The texts come from tools/golden/tokenizer_ids.py --select-only; tokenizer_ids.py --check
// confirms the result with the Python libraries. Run it outside the repository, where the npm package is:
//
//   python3 tools/golden/tokenizer_ids.py --select-only --out /tmp/tk/texts.json
//   cd /tmp/tk && npm init -y && npm install --ignore-scripts @huggingface/transformers
//   cp $REPO/tools/golden/tokenizer_ids_reference.mjs . && node tokenizer_ids_reference.mjs texts.json \
//       ~/.cache/hadatrain/lm $REPO/tests/fixtures/tokenizer_ids.json
import { AutoTokenizer, env } from '@huggingface/transformers';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';

const [textsFile, cache, outFile] = process.argv.slice(2);
if (!outFile) throw new Error('usage: node tokenizer_ids_reference.mjs TEXTS.json CACHE_LM_DIR OUT.json');
const fx = JSON.parse(readFileSync(textsFile, 'utf8'));

env.allowRemoteModels = false;
env.localModelPath = cache + '/';
const tok3 = await AutoTokenizer.from_pretrained('llama3');
const ids3 = (t) => tok3.encode(t, { add_special_tokens: false });

// spm_encode reads one text per line: texts with a newline get null.
function spm(texts) {
  const model = cache + '/llama2/tokenizer.model';
  const r = spawnSync('spm_encode', ['--model', model, '--output_format=id'],
                      { input: texts.join('\n') + '\n', maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error('spm_encode failed: ' + r.stderr);
  const out = r.stdout.toString().split('\n');
  return texts.map((_, i) => (out[i].trim() === '' ? [] : out[i].trim().split(' ').map(Number)));
}
const plain = fx.lines.filter((t) => !t.includes('\n'));
const plainIds = spm([...plain, fx.long_text]);
let k = 0;
const llama2 = fx.lines.map((t) => (t.includes('\n') ? null : plainIds[k++]));

const out = {
  about: fx.about,
  lines: fx.lines,
  llama3: fx.lines.map(ids3),
  llama2,
  long_text: fx.long_text,
  long_llama3: ids3(fx.long_text),
  long_llama2: plainIds[plain.length],
  chats: fx.chats.map((c) => ({
    messages: c.messages,
    llama3: Array.from(tok3.apply_chat_template(c.messages, { tokenize: true, add_generation_prompt: true,
                                                              return_tensor: false, return_dict: false })),
  })),
};

// The layout of tokenizer_ids.py's write_fixture: one entry per line.
const arr = (name, items) => ` "${name}": [\n` + items.map((x) => '  ' + JSON.stringify(x)).join(',\n') + '\n ]';
const parts = [
  ` "about": ${JSON.stringify(out.about)}`, arr('lines', out.lines), arr('llama3', out.llama3),
  arr('llama2', out.llama2), ` "long_text": ${JSON.stringify(out.long_text)}`,
  ` "long_llama3": ${JSON.stringify(out.long_llama3)}`, ` "long_llama2": ${JSON.stringify(out.long_llama2)}`,
  arr('chats', out.chats),
];
writeFileSync(outFile, '{\n' + parts.join(',\n') + '\n}\n');
console.log(`${outFile}: ${out.lines.length} texts, ${out.llama3.flat().length} Llama-3 and ` +
            `${llama2.filter(Boolean).flat().length} Llama-2 ids`);
