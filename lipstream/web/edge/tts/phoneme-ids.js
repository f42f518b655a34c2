// Clauses -> Piper phonemes -> phoneme ids, the way piper-tts (Python) builds them from the voice's config.
import { toEspeak152 } from './clauses.js';

const BOS = '^';
const EOS = '$';
const PAD = '_';
const NOT_A_SENTENCE_END = new Set([',', ':', ';']);

/**
 * Group phonemized clauses ([{ ipa, terminator, endOfSentence }]) into sentences of Piper phonemes:
 * the clause's IPA without (lang) flags, its terminator, a space after , : ;, split into NFD code points
 * (accents become their own phonemes), vowel clusters merged when the voice config lists some.
 */
export function sentencesFromClauses(clauses, vowelClusters = null) {
  const sentences = [];
  let current = [];
  for (const clause of clauses) {
    let text = toEspeak152(clause.ipa).replace(/\([^)]+\)/g, '') + clause.terminator;
    if (NOT_A_SENTENCE_END.has(clause.terminator)) text += ' ';
    current.push(...Array.from(text.normalize('NFD')));
    if (clause.endOfSentence) {
      sentences.push(mergeVowelClusters(current, vowelClusters));
      current = [];
    }
  }
  if (current.length) sentences.push(mergeVowelClusters(current, vowelClusters));
  return sentences.filter((s) => s.length > 0);
}

function mergeVowelClusters(phones, clusters) {
  if (!clusters || !clusters.length) return phones;
  const known = new Set(clusters.map((c) => c.join('\u0000')));
  const maxLen = Math.max(...clusters.map((c) => c.length));
  const out = [];
  for (let i = 0; i < phones.length;) {
    let n = Math.min(maxLen, phones.length - i);
    for (; n > 1; n--) if (known.has(phones.slice(i, i + n).join('\u0000'))) break;
    if (n > 1) { out.push(phones.slice(i, i + n).join('')); i += n; } else { out.push(phones[i]); i += 1; }
  }
  return out;
}

/** Phoneme ids: BOS, PAD, then each known phoneme followed by PAD, then EOS (unknown phonemes dropped). */
export function phonemesToIds(phonemes, idMap) {
  const ids = [...idMap[BOS], ...idMap[PAD]];
  const missing = [];
  for (const phoneme of phonemes) {
    const mapped = idMap[phoneme];
    if (!mapped) { missing.push(phoneme); continue; }
    ids.push(...mapped, ...idMap[PAD]);
  }
  ids.push(...idMap[EOS]);
  return { ids, missing };
}
