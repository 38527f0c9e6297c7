//! Byte-level BPE tokenizer (GPT-2 style) built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! # Format
//!
//! A GGUF file with `tokenizer.ggml.model = "gpt2"` carries:
//!
//! - `tokenizer.ggml.tokens`: the vocabulary, token id = index. Ordinary tokens are written
//!   in GPT-2's byte-to-unicode alphabet: every byte maps to one printable character
//!   (printable Latin-1 bytes to themselves, the other 68 to U+0100..U+0143, so a space is
//!   `Ġ` and a newline `Ċ`); a token's text is the concatenation of its bytes' characters.
//! - `tokenizer.ggml.token_type` (optional): llama.cpp's token types; 3 (control, such as
//!   `<|im_start|>`) and 4 (user-defined) are special tokens, matched literally in the input
//!   and decoded as their literal text.
//! - `tokenizer.ggml.merges`: `"left right"` pairs, highest priority first; merging the
//!   pair yields the token `left + right`.
//! - `tokenizer.ggml.pre`: the pre-tokenizer, which splits text into pieces that BPE
//!   encodes independently (see [`PreTokenizer`]).
//! - `tokenizer.ggml.bos_token_id`, `eos_token_id`, `add_bos_token` (all optional).
//!
//! Encoding: special tokens are cut out first (leftmost, longest match), the text between
//! them is pre-tokenized, each piece's UTF-8 bytes become byte symbols, and adjacent pairs
//! are merged by rank (lowest rank first, leftmost first among equal ranks) until no pair
//! has a merge. Decoding maps tokens back to bytes and the bytes to text.
//!
//! # Bounds this relies on
//!
//! Everything is checked when the tokenizer is built: every merge must name two tokens
//! whose concatenation is also a token, the token-type array must match the vocabulary,
//! ids must fit in u32, and the BOS/EOS ids must lie in the vocabulary. After that,
//! `encode` cannot fail and never panics; `decode` accepts any ids (unknown ones become
//! U+FFFD). A byte whose symbol is not in the vocabulary is dropped when encoding, as
//! llama.cpp and Hugging Face `tokenizers` (without an unknown token) do; SmolLM2's
//! vocabulary lacks 21 such bytes (see [`ByteLevelBpe::unencodable_bytes`]): six rare
//! control characters, the UTF-8 lead bytes 0xF1 and 0xF2 (code points U+40000..U+BFFFF)
//! and bytes that never occur in UTF-8. Text containing them does not round-trip. Merging uses a heap over a linked list of symbols, O(n log n) per piece, so a
//! long run of text without spaces stays fast; a bounded cache remembers pieces already
//! encoded.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Mutex;

use crate::gguf::{GgufError, GgufFile};

/// llama.cpp token type of ordinary tokens.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// llama.cpp token type of control tokens (`<|im_start|>`, `<|endoftext|>`, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// llama.cpp token type of user-defined tokens, also matched literally.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The system message of SmolLM2-Instruct's chat template.
pub const SMOLLM2_SYSTEM_PROMPT: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// The prompt SmolLM2-Instruct's chat template (`tokenizer.chat_template`) renders for one
/// user message with its default system message and `add_generation_prompt = true`:
///
/// ```text
/// <|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
/// ```
///
/// `user` is inserted verbatim; like Hugging Face's `apply_chat_template` followed by
/// `encode`, special-token text inside it (`<|im_end|>`) is encoded as the special token.
/// No BOS token is involved (`add_bos_token` is false for this model).
pub fn chat_prompt(user: &str) -> String {
    format!(
        "<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BpeError {
    /// Reading the GGUF metadata failed (missing key, wrong type).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` is not `"gpt2"`.
    #[error("unsupported tokenizer model {0:?}: this tokenizer reads byte-level BPE (\"gpt2\")")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer not implemented here.
    #[error("unsupported pre-tokenizer {0:?} (supported: \"smollm\", \"gpt-2\")")]
    UnsupportedPre(String),
    /// The vocabulary has more entries than u32 ids can name.
    #[error("vocabulary of {0} tokens does not fit in u32 ids")]
    VocabTooLarge(usize),
    /// The token-type array does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TokenTypeCount {
        /// Vocabulary size.
        tokens: usize,
        /// Token-type entries.
        types: usize,
    },
    /// A merge that is not two non-empty tokens separated by a space.
    #[error("merge #{index} {merge:?} is not two tokens separated by a space")]
    BadMerge {
        /// Index in the merge list (its rank).
        index: usize,
        /// The merge as written.
        merge: String,
    },
    /// A merge naming (or producing) a token that is not in the vocabulary.
    #[error("merge #{index} {merge:?}: token {token:?} is not in the vocabulary")]
    MergeTokenUnknown {
        /// Index in the merge list (its rank).
        index: usize,
        /// The merge as written.
        merge: String,
        /// The missing token.
        token: String,
    },
    /// A BOS/EOS id outside the vocabulary.
    #[error("{what} token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        /// `"BOS"` or `"EOS"`.
        what: &'static str,
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
}

/// How text is split into pieces before BPE, by `tokenizer.ggml.pre`.
///
/// Both variants use the GPT-2 pattern
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
/// implemented by hand (no regex engine) with Rust's character properties standing in for
/// the Unicode classes: `\p{N}` is [`char::is_numeric`] (exactly Nd, Nl, No), `\s` is
/// [`char::is_whitespace`] (the White_Space property), and `\p{L}` is
/// [`char::is_alphabetic`] minus numeric characters. The last is an approximation:
/// the Alphabetic property also covers some combining marks (for example Devanagari and
/// Thai vowel signs) and a few symbols (circled letters such as `Ⓐ`) that are not `\p{L}`,
/// so text containing those can be split differently from llama.cpp and Hugging Face.
/// Text in Latin, Greek, Cyrillic, CJK and other scripts without such marks, emoji, and
/// decomposed Latin accents (U+0301 is not Alphabetic) split identically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `"smollm"`: first every `\p{N}` character becomes a piece of its own (so numbers
    /// are encoded digit by digit), then the GPT-2 pattern splits the text in between.
    /// This is llama.cpp's `LLAMA_VOCAB_PRE_TYPE_SMOLLM` and Hugging Face's
    /// `Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]`.
    SmolLm,
    /// `"gpt-2"`: the GPT-2 pattern alone (digits grouped by ` ?\p{N}+`).
    Gpt2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value.
    pub fn from_name(name: &str) -> Result<Self, BpeError> {
        match name {
            "smollm" => Ok(PreTokenizer::SmolLm),
            "gpt-2" => Ok(PreTokenizer::Gpt2),
            other => Err(BpeError::UnsupportedPre(other.to_string())),
        }
    }

    /// Splits `text` into pieces; their concatenation is `text`.
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        match self {
            PreTokenizer::Gpt2 => gpt2_split(text, &mut out),
            PreTokenizer::SmolLm => {
                let mut run_start = 0;
                for (at, c) in text.char_indices() {
                    if c.is_numeric() {
                        gpt2_split(&text[run_start..at], &mut out);
                        out.push(&text[at..at + c.len_utf8()]);
                        run_start = at + c.len_utf8();
                    }
                }
                gpt2_split(&text[run_start..], &mut out);
            }
        }
        out
    }
}

fn is_letter(c: char) -> bool {
    c.is_alphabetic() && !c.is_numeric()
}

fn is_number(c: char) -> bool {
    c.is_numeric()
}

fn is_other(c: char) -> bool {
    !c.is_whitespace() && !is_letter(c) && !is_number(c)
}

/// Appends the GPT-2 pattern's matches in `s` to `out` (they cover `s` exactly).
fn gpt2_split<'a>(s: &'a str, out: &mut Vec<&'a str>) {
    let chars: Vec<char> = s.chars().collect();
    let mut byte = 0;
    let mut i = 0;
    while i < chars.len() {
        let end = gpt2_match_end(&chars, i);
        let len: usize = chars[i..end].iter().map(|c| c.len_utf8()).sum();
        out.push(&s[byte..byte + len]);
        byte += len;
        i = end;
    }
}

/// End (exclusive) of the pattern's match starting at `c[i]` (`i < c.len()`); every
/// character is matched by some alternative, so the match is never empty.
fn gpt2_match_end(c: &[char], i: usize) -> usize {
    let n = c.len();
    let run = |mut j: usize, class: fn(char) -> bool| {
        while j < n && class(c[j]) {
            j += 1;
        }
        j
    };
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2)
    if c[i] == '\'' && i + 1 < n {
        match c[i + 1] {
            's' | 't' | 'm' | 'd' => return i + 2,
            'r' | 'v' if i + 2 < n && c[i + 2] == 'e' => return i + 3,
            'l' if i + 2 < n && c[i + 2] == 'l' => return i + 3,
            _ => {}
        }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a space is in none of the three
    // classes, so the character after an optional leading space picks the alternative.
    let classes: [fn(char) -> bool; 3] = [is_letter, is_number, is_other];
    for class in classes {
        if c[i] == ' ' && i + 1 < n && class(c[i + 1]) {
            return run(i + 2, class);
        }
        if class(c[i]) {
            return run(i + 1, class);
        }
    }
    // Whitespace. `\s+(?!\S)`: the whole run if it ends the text, else the run minus its
    // last character (which then leads the next piece, e.g. " word"), if that leaves any;
    // otherwise `\s+`: the single whitespace character.
    let end = run(i, char::is_whitespace);
    if end == n || end - i == 1 {
        end
    } else {
        end - 1
    }
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other 68
/// bytes, in order, to U+0100 + k.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            next_extra += 1;
            0xFF + next_extra
        };
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// One part of the input after special tokens are cut out.
enum Segment<'a> {
    Text(&'a str),
    Special(u32),
}

/// Special tokens (bytes, id) sharing a first byte, longest first.
type SpecialsByFirstByte = HashMap<u8, Vec<(Box<[u8]>, u32)>>;

/// Most pieces the per-piece cache holds before it is cleared.
const CACHE_CAPACITY: usize = 1 << 16;
/// Longest piece (in bytes) that is cached.
const CACHE_MAX_PIECE: usize = 128;

/// A byte-level BPE tokenizer. `encode` takes `&self` (the piece cache sits behind a
/// mutex), so one tokenizer can be shared between threads.
pub struct ByteLevelBpe {
    tokens: Vec<String>,
    token_types: Vec<i32>,
    token_to_id: HashMap<String, u32>,
    /// Bytes each token decodes to.
    token_bytes: Vec<Box<[u8]>>,
    /// Token of each byte's symbol, if the vocabulary has it.
    byte_token: [Option<u32>; 256],
    /// (left, right) -> (rank, merged token).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Special tokens by first byte, longest first.
    specials_by_first_byte: SpecialsByFirstByte,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteLevelBpe")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field(
                "special_tokens",
                &self
                    .specials_by_first_byte
                    .values()
                    .map(Vec::len)
                    .sum::<usize>(),
            )
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl ByteLevelBpe {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (see the module
    /// docs for the keys). `token_type`, the BOS/EOS ids and `add_bos_token` are optional.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, BpeError> {
        let model = file.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(BpeError::UnsupportedModel(model.to_string()));
        }
        let pre = PreTokenizer::from_name(file.get_str("tokenizer.ggml.pre")?)?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let token_types = match file.metadata("tokenizer.ggml.token_type") {
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?.to_vec(),
        };
        let merges = file.get_str_array("tokenizer.ggml.merges")?;
        let optional_id = |key: &str| match file.metadata(key) {
            None => Ok(None),
            Some(_) => file.get_u32(key).map(Some),
        };
        let bos = optional_id("tokenizer.ggml.bos_token_id")?;
        let eos = optional_id("tokenizer.ggml.eos_token_id")?;
        let mut bpe = Self::new(tokens, token_types, merges, pre, bos, eos)?;
        if file.metadata("tokenizer.ggml.add_bos_token").is_some() {
            bpe.add_bos = file.get_bool("tokenizer.ggml.add_bos_token")?;
        }
        Ok(bpe)
    }

    /// Builds the tokenizer from plain parts: the vocabulary (byte-level strings, id =
    /// index), one llama.cpp token type per token, the merges (`"left right"`, highest
    /// priority first) and the BOS/EOS ids. Duplicate token strings map to the last id;
    /// a merge listed twice keeps its first (higher-priority) rank. `add_bos_token`
    /// starts false.
    pub fn new(
        tokens: Vec<String>,
        token_types: Vec<i32>,
        merges: &[impl AsRef<str>],
        pre: PreTokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<Self, BpeError> {
        if u32::try_from(tokens.len()).is_err() {
            return Err(BpeError::VocabTooLarge(tokens.len()));
        }
        if token_types.len() != tokens.len() {
            return Err(BpeError::TokenTypeCount {
                tokens: tokens.len(),
                types: token_types.len(),
            });
        }
        for (what, id) in [("BOS", bos), ("EOS", eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= tokens.len()) {
                return Err(BpeError::IdOutOfRange {
                    what,
                    id,
                    vocab_size: tokens.len(),
                });
            }
        }
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();

        let byte_chars = byte_to_char_table();
        let mut char_to_byte: HashMap<char, u8> = HashMap::with_capacity(256);
        let mut byte_token = [None; 256];
        for (b, &c) in byte_chars.iter().enumerate() {
            char_to_byte.insert(c, b as u8);
            byte_token[b] = token_to_id.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
        }

        let is_special = |ty: i32| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED;
        let token_bytes = tokens
            .iter()
            .zip(&token_types)
            .map(|(t, &ty)| {
                if is_special(ty) {
                    t.as_bytes().into()
                } else {
                    let mut bytes = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => bytes.push(b),
                            // Not a byte-level symbol: decode it as itself.
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    bytes.into_boxed_slice()
                }
            })
            .collect();

        let mut merge_map = HashMap::with_capacity(merges.len());
        for (index, merge) in merges.iter().enumerate() {
            let merge = merge.as_ref();
            let bad = || BpeError::BadMerge {
                index,
                merge: merge.to_string(),
            };
            // Split at the first space after the first character, as llama.cpp does.
            let first_len = merge.chars().next().map_or(0, char::len_utf8);
            let split = merge[first_len..]
                .find(' ')
                .map(|p| p + first_len)
                .ok_or_else(bad)?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            if left.is_empty() || right.is_empty() {
                return Err(bad());
            }
            let merged = format!("{left}{right}");
            let id = |token: &str| {
                token_to_id
                    .get(token)
                    .copied()
                    .ok_or_else(|| BpeError::MergeTokenUnknown {
                        index,
                        merge: merge.to_string(),
                        token: token.to_string(),
                    })
            };
            let (l, r, m) = (id(left)?, id(right)?, id(&merged)?);
            let rank = u32::try_from(index).unwrap_or(u32::MAX);
            merge_map.entry((l, r)).or_insert((rank, m));
        }

        let mut specials_by_first_byte = SpecialsByFirstByte::new();
        for (id, (t, &ty)) in tokens.iter().zip(&token_types).enumerate() {
            if is_special(ty) && !t.is_empty() {
                specials_by_first_byte
                    .entry(t.as_bytes()[0])
                    .or_default()
                    .push((t.as_bytes().into(), id as u32));
            }
        }
        for list in specials_by_first_byte.values_mut() {
            list.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }

        Ok(ByteLevelBpe {
            tokens,
            token_types,
            token_to_id,
            token_bytes,
            byte_token,
            merges: merge_map,
            specials_by_first_byte,
            pre,
            bos,
            eos,
            add_bos: false,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token, if the file names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the file names one (`<|im_end|>` = 2 for SmolLM2).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.add_bos_token`: whether a prompt should start with BOS. [`encode`]
    /// never adds it; the caller decides.
    ///
    /// [`encode`]: ByteLevelBpe::encode
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Bytes whose byte-level symbol is not in the vocabulary; [`encode`] drops them.
    ///
    /// [`encode`]: ByteLevelBpe::encode
    pub fn unencodable_bytes(&self) -> Vec<u8> {
        (0..=255u8)
            .filter(|&b| self.byte_token[b as usize].is_none())
            .collect()
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// The id of a token given as its vocabulary string (byte-level form for ordinary
    /// tokens: `"Ġthe"`; literal for special tokens: `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.token_to_id.get(token).copied()
    }

    /// A token's vocabulary string.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether `id` is a special token (control or user-defined), matched literally.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_types.get(id as usize),
            Some(&TOKEN_TYPE_CONTROL | &TOKEN_TYPE_USER_DEFINED)
        )
    }

    /// Encodes `text`: special tokens matched literally, the rest pre-tokenized and
    /// merged. No BOS is added. Bytes listed by [`ByteLevelBpe::unencodable_bytes`] are
    /// dropped.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        for segment in self.split_specials(text) {
            match segment {
                Segment::Special(id) => ids.push(id),
                Segment::Text(t) => {
                    for piece in self.pre.split(t) {
                        self.encode_piece(piece, &mut ids);
                    }
                }
            }
        }
        ids
    }

    /// Cuts special tokens out of `text`: at each position the longest special token
    /// starting there, leftmost first.
    fn split_specials<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let (mut i, mut last) = (0, 0);
        while i < bytes.len() {
            let found = self
                .specials_by_first_byte
                .get(&bytes[i])
                .and_then(|list| list.iter().find(|(s, _)| bytes[i..].starts_with(s)));
            match found {
                // A special token starts with a UTF-8 lead byte, so `i` is a char boundary.
                Some((s, id)) => {
                    if last < i {
                        out.push(Segment::Text(&text[last..i]));
                    }
                    out.push(Segment::Special(*id));
                    i += s.len();
                    last = i;
                }
                None => i += 1,
            }
        }
        if last < bytes.len() {
            out.push(Segment::Text(&text[last..]));
        }
        out
    }

    /// BPE on one pre-tokenized piece, through the cache.
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        let cacheable = piece.len() <= CACHE_MAX_PIECE;
        if cacheable {
            if let Some(ids) = self.cache.lock().ok().and_then(|c| c.get(piece).cloned()) {
                out.extend_from_slice(&ids);
                return;
            }
        }
        let ids = self.merge(piece.as_bytes());
        out.extend_from_slice(&ids);
        if cacheable {
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= CACHE_CAPACITY {
                    cache.clear();
                }
                cache.insert(piece.to_string(), ids);
            }
        }
    }

    /// Merges the byte symbols of `bytes` (dropping bytes without one): repeatedly the adjacent pair with the lowest
    /// rank (leftmost among equals), via a heap of candidate pairs over a linked list.
    fn merge(&self, bytes: &[u8]) -> Vec<u32> {
        let mut ids: Vec<u32> = bytes
            .iter()
            .filter_map(|&b| self.byte_token[b as usize])
            .collect();
        let n = ids.len();
        if n < 2 {
            return ids;
        }
        const NONE: usize = usize::MAX;
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { NONE } else { i - 1 }).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        let rank_of = |ids: &[u32], l: usize, r: usize| {
            self.merges.get(&(ids[l], ids[r])).map(|&(rank, _)| rank)
        };
        for i in 0..n - 1 {
            if let Some(rank) = rank_of(&ids, i, i + 1) {
                heap.push(Reverse((rank, i)));
            }
        }
        while let Some(Reverse((rank, left))) = heap.pop() {
            let right = next[left];
            if !alive[left] || right == NONE {
                continue;
            }
            // Stale entry: the pair at `left` changed since it was pushed (ranks are
            // unique per pair, so an equal rank means the same pair).
            let Some(&(current, merged)) = self.merges.get(&(ids[left], ids[right])) else {
                continue;
            };
            if current != rank {
                continue;
            }
            ids[left] = merged;
            alive[right] = false;
            next[left] = next[right];
            if next[left] != NONE {
                prev[next[left]] = left;
            }
            if prev[left] != NONE {
                if let Some(rank) = rank_of(&ids, prev[left], left) {
                    heap.push(Reverse((rank, prev[left])));
                }
            }
            if next[left] != NONE {
                if let Some(rank) = rank_of(&ids, left, next[left]) {
                    heap.push(Reverse((rank, left)));
                }
            }
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i != NONE {
            out.push(ids[i]);
            i = next[i];
        }
        out
    }

    /// The bytes a token decodes to; U+FFFD's bytes for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        match self.token_bytes.get(id as usize) {
            Some(b) => b,
            None => "\u{FFFD}".as_bytes(),
        }
    }

    /// Decodes ids to text (special tokens as their literal text). Byte sequences that are
    /// not UTF-8 become U+FFFD, as in [`String::from_utf8_lossy`].
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A decoder fed one token at a time (for printing generated text as it comes).
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            bpe: self,
            pending: Vec::new(),
        }
    }
}

/// Decodes a token stream incrementally: [`StreamDecoder::push`] returns only complete
/// UTF-8 text and holds back the start of a character split across tokens. The
/// concatenation of every `push` and the final [`StreamDecoder::finish`] equals
/// [`ByteLevelBpe::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    bpe: &'a ByteLevelBpe,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.bpe.token_bytes(id));
        self.drain(false)
    }

    /// Flushes what is held back (an incomplete character becomes U+FFFD).
    pub fn finish(mut self) -> String {
        self.drain(true)
    }

    /// Bytes held back, at most 3 (an incomplete UTF-8 sequence).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn drain(&mut self, at_end: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &after[bad..];
                        }
                        None if at_end => {
                            out.push('\u{FFFD}');
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::{smollm2, GgufWriter, Rng};
    use crate::gguf::{Array, Value};

    fn byte_vocab() -> Vec<String> {
        byte_to_char_table().iter().map(|c| c.to_string()).collect()
    }

    /// The 256 byte symbols, one token per merge result, then `extra` tokens.
    fn tiny(merges: &[&str], extra: &[(&str, i32)], pre: PreTokenizer) -> ByteLevelBpe {
        let (tokens, types) = tiny_vocab(merges, extra);
        ByteLevelBpe::new(tokens, types, merges, pre, None, None).unwrap()
    }

    fn tiny_vocab(merges: &[&str], extra: &[(&str, i32)]) -> (Vec<String>, Vec<i32>) {
        let mut tokens = byte_vocab();
        for m in merges {
            let merged = m.replacen(' ', "", 1);
            if !tokens.contains(&merged) {
                tokens.push(merged);
            }
        }
        tokens.extend(extra.iter().map(|(t, _)| t.to_string()));
        let mut types = vec![TOKEN_TYPE_NORMAL; tokens.len() - extra.len()];
        types.extend(extra.iter().map(|&(_, ty)| ty));
        (tokens, types)
    }

    fn strs<'a>(bpe: &'a ByteLevelBpe, ids: &[u32]) -> Vec<&'a str> {
        ids.iter().map(|&id| bpe.id_to_token(id).unwrap()).collect()
    }

    const HELLO_MERGES: &[&str] = &[
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ Ġ",
    ];

    #[test]
    fn byte_to_unicode_table() {
        let t = byte_to_char_table();
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert_eq!(
            (t[b'!' as usize], t[b'~' as usize], t[b'A' as usize]),
            ('!', '~', 'A')
        );
        assert_eq!(
            (t[b' ' as usize], t[b'\n' as usize], t[b'\t' as usize]),
            ('Ġ', 'Ċ', 'ĉ')
        );
        assert_eq!(
            (t[0], t[0x7F], t[0xA0], t[0xAD]),
            ('\u{100}', '\u{121}', '\u{142}', '\u{143}')
        );
        assert_eq!((t[0xA1], t[0xAC], t[0xAE], t[0xFF]), ('¡', '¬', '®', 'ÿ'));
    }

    #[test]
    fn gpt2_pattern_pieces() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("Hello world", &["Hello", " world"]),
            ("a  b", &["a", " ", " b"]),
            ("a   \n\n b", &["a", "   \n\n", " b"]),
            ("x \n", &["x", " \n"]),
            ("  ", &["  "]),
            ("\t\tx", &["\t", "\t", "x"]),
            ("x\ny", &["x", "\n", "y"]),
            (
                "don't it's we'll I'M they're he'd I've 've 'd",
                &[
                    "don", "'t", " it", "'s", " we", "'ll", " I", "'", "M", " they", "'re", " he",
                    "'d", " I", "'ve", " '", "ve", " '", "d",
                ],
            ),
            ("o'clock ''s", &["o", "'", "clock", " ''", "s"]),
            ("Hi!!! ...ok", &["Hi", "!!!", " ...", "ok"]),
            ("日本語 🙂🙂 é", &["日本語", " 🙂🙂", " é"]),
            ("a\u{a0}b", &["a", "\u{a0}", "b"]),
            ("x12 y", &["x", "12", " y"]),
        ];
        for (text, want) in cases {
            assert_eq!(PreTokenizer::Gpt2.split(text), *want, "{text:?}");
        }
    }

    #[test]
    fn smollm_splits_digits_first() {
        let cases: &[(&str, &[&str])] = &[
            (
                "12345 3.14",
                &["1", "2", "3", "4", "5", " ", "3", ".", "1", "4"],
            ),
            ("x12 y", &["x", "1", "2", " y"]),
            ("a 7b", &["a", " ", "7", "b"]),
            ("½²", &["½", "²"]),
            ("no digits here", &["no", " digits", " here"]),
        ];
        for (text, want) in cases {
            assert_eq!(PreTokenizer::SmolLm.split(text), *want, "{text:?}");
        }
        assert_eq!(
            PreTokenizer::Gpt2.split("12345 3.14"),
            ["12345", " 3", ".", "14"]
        );
        assert_eq!(
            PreTokenizer::from_name("smollm").unwrap(),
            PreTokenizer::SmolLm
        );
        assert_eq!(
            PreTokenizer::from_name("gpt-2").unwrap(),
            PreTokenizer::Gpt2
        );
        let err = PreTokenizer::from_name("llama3").unwrap_err();
        assert!(matches!(&err, BpeError::UnsupportedPre(p) if p == "llama3"));
        assert_eq!(
            err.to_string(),
            "unsupported pre-tokenizer \"llama3\" (supported: \"smollm\", \"gpt-2\")"
        );
    }

    #[test]
    fn merges_apply_by_rank_then_leftmost() {
        let bpe = tiny(HELLO_MERGES, &[], PreTokenizer::SmolLm);
        assert_eq!(strs(&bpe, &bpe.encode("hello world")), ["hello", "Ġworld"]);
        assert_eq!(
            strs(&bpe, &bpe.encode("hello  world")),
            ["hello", "Ġ", "Ġworld"]
        );
        assert_eq!(strs(&bpe, &bpe.encode("hellohello")), ["hello", "hello"]);
        assert_eq!(strs(&bpe, &bpe.encode("hex")), ["he", "x"]);
        // Rank decides between overlapping pairs.
        let ab_first = tiny(&["a b", "b c"], &[], PreTokenizer::SmolLm);
        assert_eq!(strs(&ab_first, &ab_first.encode("abc")), ["ab", "c"]);
        let bc_first = tiny(&["b c", "a b"], &[], PreTokenizer::SmolLm);
        assert_eq!(strs(&bc_first, &bc_first.encode("abc")), ["a", "bc"]);
        // Equal pairs: leftmost first, and merged tokens merge again.
        let aa = tiny(&["a a", "aa aa"], &[], PreTokenizer::SmolLm);
        assert_eq!(strs(&aa, &aa.encode("aaa")), ["aa", "a"]);
        assert_eq!(strs(&aa, &aa.encode("aaaaaaaaa")), ["aaaa", "aaaa", "a"]);
        // A merge listed twice keeps its first rank.
        let dup = tiny(&["b c", "a b", "b c"], &[], PreTokenizer::SmolLm);
        assert_eq!(strs(&dup, &dup.encode("abc")), ["a", "bc"]);
        // A long piece with no spaces stays linear-ish (heap merging), and is exact.
        let long = "a".repeat(200_001);
        let ids = aa.encode(&long);
        assert_eq!(ids.len(), 50_001);
        assert_eq!(aa.decode(&ids), long);
        assert_eq!(strs(&aa, &ids[49_999..]), ["aaaa", "a"]);
        // Cached and uncached results agree.
        assert_eq!(
            bpe.encode("hello world hello"),
            bpe.encode("hello world hello")
        );
    }

    #[test]
    fn special_tokens_match_literally_longest_first() {
        let bpe = tiny(
            HELLO_MERGES,
            &[
                ("<|eot|>", TOKEN_TYPE_CONTROL),
                ("<|e", TOKEN_TYPE_USER_DEFINED),
                ("<x>", TOKEN_TYPE_NORMAL),
            ],
            PreTokenizer::SmolLm,
        );
        let eot = bpe.token_to_id("<|eot|>").unwrap();
        let e = bpe.token_to_id("<|e").unwrap();
        let ids = bpe.encode("hello<|eot|><|eot|> world<|e>");
        assert_eq!(
            strs(&bpe, &ids),
            ["hello", "<|eot|>", "<|eot|>", "Ġworld", "<|e", ">"]
        );
        assert_eq!((ids[1], ids[4]), (eot, e));
        assert!(bpe.is_special(eot) && bpe.is_special(e));
        // A normal token is not matched literally: "<x>" goes through BPE as bytes.
        assert_eq!(strs(&bpe, &bpe.encode("<x>")), ["<", "x", ">"]);
        assert!(!bpe.is_special(bpe.token_to_id("<x>").unwrap()));
        assert_eq!(bpe.decode(&ids), "hello<|eot|><|eot|> world<|e>");
        // Specials split the text for pre-tokenization: no piece spans one.
        assert_eq!(
            strs(&bpe, &bpe.encode(" <|eot|>he")),
            ["Ġ", "<|eot|>", "he"]
        );
    }

    #[test]
    fn decode_round_trips_and_is_lossy_on_bad_bytes() {
        let bpe = tiny(
            HELLO_MERGES,
            &[("<|eot|>", TOKEN_TYPE_CONTROL)],
            PreTokenizer::SmolLm,
        );
        let texts = [
            "hello world",
            "",
            "  leading, trailing  \n",
            "\u{0}\u{1}\u{7f}\u{ad} control bytes",
            "café naïve 日本語 🙂 ½²",
            "tabs\tand\r\nCRLF <|eot|> don't 12345",
        ];
        for t in texts {
            assert_eq!(bpe.decode(&bpe.encode(t)), t);
        }
        let mut rng = Rng::new(99);
        for _ in 0..300 {
            let len = rng.below(20);
            let s: String = (0..len)
                .map(|_| match rng.below(4) {
                    0 => char::from(b' ' + rng.below(95) as u8),
                    1 => ['\n', '\t', ' ', '\'', '7'][rng.below(5)],
                    _ => char::from_u32(rng.below(0x2FFFF) as u32).unwrap_or('x'),
                })
                .collect();
            assert_eq!(bpe.decode(&bpe.encode(&s)), s, "{s:?}");
        }
        assert_eq!(bpe.decode(&[u32::MAX]), "\u{FFFD}");
        let byte = |b: u8| bpe.byte_token[b as usize].unwrap();
        assert_eq!(bpe.decode(&[byte(0xF0), byte(b'a')]), "\u{FFFD}a");
        assert_eq!(bpe.decode(&[byte(0xFF)]), "\u{FFFD}");
    }

    #[test]
    fn stream_decoder_holds_back_partial_characters() {
        let bpe = tiny(HELLO_MERGES, &[], PreTokenizer::SmolLm);
        // Only byte symbols for "🙂" (F0 9F 99 82): three pushes give nothing, the fourth the emoji.
        let ids = bpe.encode("🙂");
        assert_eq!(ids.len(), 4);
        let mut d = bpe.stream_decoder();
        let outs: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
        assert_eq!(outs, ["", "", "", "🙂"]);
        assert_eq!(d.pending_len(), 0);
        assert_eq!(d.finish(), "");
        let mut d = bpe.stream_decoder();
        assert_eq!(d.push(bpe.token_to_id("hello").unwrap()), "hello");
        assert_eq!(d.push(ids[0]), "");
        assert_eq!(d.push(ids[1]), "");
        assert_eq!(d.pending_len(), 2);
        assert_eq!(d.finish(), "\u{FFFD}");
        // A broken sequence followed by text is replaced at once, not held.
        let mut d = bpe.stream_decoder();
        assert_eq!(d.push(ids[0]), "");
        assert_eq!(d.push(bpe.token_to_id("Ġworld").unwrap()), "\u{FFFD} world");
        // Random id streams: the pieces always add up to decode().
        let mut rng = Rng::new(5);
        for _ in 0..500 {
            let ids: Vec<u32> = (0..rng.below(12))
                .map(|_| match rng.below(10) {
                    0 => u32::MAX,
                    _ => rng.below(bpe.vocab_size()) as u32,
                })
                .collect();
            let mut d = bpe.stream_decoder();
            let mut text: String = ids.iter().map(|&id| d.push(id)).collect();
            assert!(d.pending_len() <= 3);
            text.push_str(&d.finish());
            assert_eq!(text, bpe.decode(&ids), "{ids:?}");
        }
    }

    #[test]
    fn construction_errors() {
        let (tokens, types) = tiny_vocab(&["a b"], &[]);
        let build = |tokens: Vec<String>, types: Vec<i32>, merges: &[&str]| {
            ByteLevelBpe::new(
                tokens,
                types,
                merges,
                PreTokenizer::SmolLm,
                Some(0),
                Some(1),
            )
        };
        assert!(build(tokens.clone(), types.clone(), &["a b"]).is_ok());
        // A byte without a symbol token is dropped by encode (and listed).
        let mut missing = tokens.clone();
        missing[b'\n' as usize] = "not a byte".into();
        let bpe = build(missing, types.clone(), &["a b"]).unwrap();
        assert_eq!(bpe.unencodable_bytes(), [b'\n']);
        assert_eq!(strs(&bpe, &bpe.encode("ab\n\nab\n")), ["ab", "ab"]);
        assert_eq!(
            build(tokens.clone(), types.clone(), &[])
                .unwrap()
                .unencodable_bytes(),
            Vec::<u8>::new()
        );
        for bad in ["ab", "a ", " a", ""] {
            let err = build(tokens.clone(), types.clone(), &["a b", bad]).unwrap_err();
            assert!(
                matches!(&err, BpeError::BadMerge { index: 1, merge } if merge == bad),
                "{bad:?}: {err:?}"
            );
        }
        let err = build(tokens.clone(), types.clone(), &["b a"]).unwrap_err();
        assert!(
            matches!(&err, BpeError::MergeTokenUnknown { token, .. } if token == "ba"),
            "{err:?}"
        );
        let err = build(tokens.clone(), types.clone(), &["a zz"]).unwrap_err();
        assert!(
            matches!(&err, BpeError::MergeTokenUnknown { token, .. } if token == "zz"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "merge #0 \"a zz\": token \"zz\" is not in the vocabulary"
        );
        let err = build(tokens.clone(), types[1..].to_vec(), &[]).unwrap_err();
        assert!(
            matches!(
                err,
                BpeError::TokenTypeCount {
                    tokens: 257,
                    types: 256
                }
            ),
            "{err:?}"
        );
        let err = ByteLevelBpe::new(
            tokens.clone(),
            types.clone(),
            &["a b"],
            PreTokenizer::SmolLm,
            None,
            Some(257),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                BpeError::IdOutOfRange {
                    what: "EOS",
                    id: 257,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    fn tokenizer_gguf(model: &str, pre: &str, types: Option<Value>) -> crate::gguf::GgufFile {
        let (tokens, tys) = tiny_vocab(HELLO_MERGES, &[("<|im_end|>", TOKEN_TYPE_CONTROL)]);
        let mut w = GgufWriter::new()
            .kv("tokenizer.ggml.model", Value::String(model.into()))
            .kv("tokenizer.ggml.pre", Value::String(pre.into()))
            .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
            .kv(
                "tokenizer.ggml.merges",
                Value::Array(Array::String(
                    HELLO_MERGES.iter().map(|s| s.to_string()).collect(),
                )),
            )
            .kv(
                "tokenizer.ggml.bos_token_id",
                Value::U32(b'B' as u32 - 0x21),
            )
            .kv("tokenizer.ggml.eos_token_id", Value::U32(266))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(true));
        w = w.kv(
            "tokenizer.ggml.token_type",
            types.unwrap_or(Value::Array(Array::I32(tys))),
        );
        crate::gguf::GgufFile::parse(w.build()).unwrap()
    }

    #[test]
    fn from_gguf_metadata() {
        let bpe = ByteLevelBpe::from_gguf(&tokenizer_gguf("gpt2", "smollm", None)).unwrap();
        assert_eq!(bpe.vocab_size(), 256 + HELLO_MERGES.len() + 1);
        assert_eq!(
            (bpe.bos_id(), bpe.eos_id(), bpe.add_bos_token()),
            (Some(33), Some(266), true)
        );
        assert_eq!(bpe.id_to_token(266), Some("<|im_end|>"));
        assert_eq!(
            strs(&bpe, &bpe.encode("hello world<|im_end|>")),
            ["hello", "Ġworld", "<|im_end|>"]
        );
        assert_eq!(bpe.pre_tokenizer(), PreTokenizer::SmolLm);
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf("llama", "smollm", None)).unwrap_err();
        assert!(
            matches!(&err, BpeError::UnsupportedModel(m) if m == "llama"),
            "{err:?}"
        );
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf("gpt2", "qwen2", None)).unwrap_err();
        assert!(
            matches!(&err, BpeError::UnsupportedPre(p) if p == "qwen2"),
            "{err:?}"
        );
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf(
            "gpt2",
            "smollm",
            Some(Value::Array(Array::U32(vec![]))),
        ))
        .unwrap_err();
        assert!(
            matches!(err, BpeError::Gguf(GgufError::WrongType { .. })),
            "{err:?}"
        );
        let empty = crate::gguf::GgufFile::parse(GgufWriter::new().build()).unwrap();
        let err = ByteLevelBpe::from_gguf(&empty).unwrap_err();
        assert!(
            matches!(&err, BpeError::Gguf(GgufError::MissingKey(k)) if k == "tokenizer.ggml.model"),
            "{err:?}"
        );
    }

    #[test]
    fn chat_prompt_is_the_smollm2_template() {
        assert_eq!(
            chat_prompt("Hi there"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn real_smollm2_tokenizer() {
        let Some(file) = smollm2() else { return };
        let bpe = ByteLevelBpe::from_gguf(file).unwrap();
        assert_eq!(bpe.vocab_size(), 49152);
        assert_eq!(
            (bpe.bos_id(), bpe.eos_id(), bpe.add_bos_token()),
            (Some(1), Some(2), false)
        );
        assert_eq!(bpe.pre_tokenizer(), PreTokenizer::SmolLm);
        assert_eq!(bpe.token_to_id("<|im_start|>"), Some(1));
        assert_eq!(bpe.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(bpe.token_to_id("<|endoftext|>"), Some(0));
        assert_eq!(bpe.token_to_id("Ġthe"), Some(260));
        assert!(bpe.is_special(2) && !bpe.is_special(260));
        let missing = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2];
        assert_eq!(
            bpe.unencodable_bytes(),
            [&missing[..], &(0xf5..=0xff).collect::<Vec<u8>>()].concat()
        );

        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("testdata/bpe_reference.json")).unwrap();
        let user = fixture["chat_user"].as_str().unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert!(cases.len() > 100);
        assert_eq!(cases.iter().filter(|c| c["lossy"] == true).count(), 2);
        assert!(cases
            .iter()
            .any(|c| c["text"].as_str() == Some(chat_prompt(user).as_str())));
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = bpe.encode(text);
            if got != want {
                failures.push(format!(
                    "{text:?}\n   got  {:?}\n   want {:?}",
                    strs(&bpe, &got),
                    strs(&bpe, &want)
                ));
            }
            let decoded = bpe.decode(&got);
            let lossy = case["lossy"].as_bool().unwrap_or(false);
            assert_eq!(decoded == text, !lossy, "{text:?} decodes to {decoded:?}");
            let mut d = bpe.stream_decoder();
            let mut streamed: String = got.iter().map(|&id| d.push(id)).collect();
            streamed.push_str(&d.finish());
            assert_eq!(streamed, decoded);
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }
}
