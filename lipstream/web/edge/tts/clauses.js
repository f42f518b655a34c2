// Text -> clauses the way eSpeak NG's reader cuts them (what Piper's espeakbridge returns): each clause
// with its terminator ('.', '?', '!', ',', ':', ';' or '' for an ellipsis) and whether it ends a sentence.

// Punctuation that ends a clause when followed by whitespace or the end of the text.
const CLAUSE_END = /(\.\.\.|…|[.?!,:;])+(?=\s|$)/g;
const SENTENCE_TERMINATORS = new Set(['.', '?', '!']);

/**
 * Split text into clauses: [{ text, terminator, endOfSentence }]. `text` keeps its punctuation (eSpeak
 * reads a question differently), the terminator is the last clause mark ('' after an ellipsis).
 */
export function splitClauses(text) {
  const clauses = [];
  let start = 0;
  for (const match of text.matchAll(CLAUSE_END)) {
    const end = match.index + match[0].length;
    const piece = text.slice(start, end).trim();
    start = end;
    if (!/[\p{L}\p{N}]/u.test(piece)) continue; // punctuation alone: nothing to say
    const marks = match[0];
    const ellipsis = /(\.\.\.|…)$/.test(marks);
    const terminator = ellipsis ? '' : marks[marks.length - 1];
    clauses.push({ text: piece, terminator, endOfSentence: SENTENCE_TERMINATORS.has(terminator) });
  }
  const rest = text.slice(start).trim();
  if (/[\p{L}\p{N}]/u.test(rest)) clauses.push({ text: rest, terminator: '', endOfSentence: true });
  else if (clauses.length) clauses[clauses.length - 1].endOfSentence = true;
  return clauses;
}

// The eSpeak NG inside npm `phonemizer` 1.2.1 is older than the 1.52 build Piper's Python package uses
// (and its voices were trained on). Two systematic differences of the IPA it writes are rewritten here:
//  - the en-US phoneme "o@" (four, more, board) is written ɔːɹ by 1.52, oːɹ by the older build;
//  - 1.52 links a word ending in i/iː/ɪ (not the diphthongs eɪ aɪ ɔɪ) to a vowel-initial next word with ʲ ("ðɪʲ ˈɛnd", "siːʲ ɪt").
// What is left is stress on a few short questions ("What?": wˈʌt here, wˌʌt in 1.52); docs/web-export.md.
const VOWEL_START = 'aeiouæɐɑɒɔəɚɛɜɪʊʌᵻ';
const LINKING_I = new RegExp(`(?<![aeoɔ])(i|iː|ɪ)( [ˈˌ]?)(?=[${VOWEL_START}])`, 'gu');

/** The IPA of one clause as eSpeak NG 1.52 writes it (see above). */
export function toEspeak152(ipa) {
  return ipa.replace(/oːɹ/g, 'ɔːɹ').replace(LINKING_I, '$1ʲ$2');
}
