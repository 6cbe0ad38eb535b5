//! The requests of the two OpenAI routes, `/v1/completions` and `/v1/chat/completions`: the
//! fields both read (OpenAI's sampling, stop, stream and limits, and infgram's own) are listed
//! once, in `shared_fields!`, and written into each route's struct beside its own fields.
//! Each struct refuses a field it does not name, as OpenAI's API does; `#[serde(flatten)]` of
//! one shared struct could not (serde ignores `deny_unknown_fields` across a flatten). Each
//! route turns its request into one [`Completion`], which the generation worker runs.

use super::completions::Mode;
use crate::service::request::{CorpusRule, Prompt};
use serde::Deserialize;
use serde_json::Value;

/// Calls `$write!` with its own arguments followed by the fields every OpenAI route reads,
/// each written `doc comments, name: type,` (all optional: serde's default when left out).
macro_rules! shared_fields {
    ($write:ident ! { $($args:tt)* }) => {
        $write! { $($args)*
            /// The model's name (any value: the server has one model).
            model: Option<String>,
            /// Tokens to generate at most (default: the library's, within the server's limit).
            max_tokens: Option<usize>,
            /// Sampling temperature (0: greedy; default: the library's).
            temperature: Option<f64>,
            /// Nucleus mass, in (0, 1].
            top_p: Option<f64>,
            /// Keep the k most likely tokens (0: all).
            top_k: Option<usize>,
            /// Random seed (same seed, same text).
            seed: Option<u64>,
            /// Text that ends the answer where it first appears (not included): a string, or
            /// up to 4.
            stop: Option<Value>,
            /// Stream the answer as server-sent events.
            stream: bool,
            /// Answers per request: only 1.
            n: Option<usize>,
            /// OpenAI's end-user name, which changes nothing here.
            user: Option<String>,
            /// How to generate (default: `neural` with a model, else `sbis`; a greedy chat
            /// decodes speculatively).
            mode: Option<Mode>,
            /// The served index to generate from (sbis) or to draft, mix and guard with.
            index: Option<String>,
            /// The copy guard: the output never repeats more than this many tokens of the index.
            guard: Option<usize>,
            /// Verify drafts (prompt lookup, past outputs, the index) with mode `neural` or
            /// `mix` (mode `speculative` is `neural` with this set; `false` there is refused).
            speculative: Option<bool>,
            /// Also decode without drafts and report both speeds and whether the outputs are
            /// the same (`infgram gen --compare`; the job takes twice as long).
            compare: bool,
            /// How the index drafts: `sbis` (default) or `longest_suffix`.
            corpus_rule: CorpusRule,
            /// With a model: `false` reads the prompt whole and keeps nothing of this
            /// request's cache for later ones (`--prompt-cache-mib`); default true.
            cache_prompt: Option<bool>,
        }
    };
}

/// Writes [`Options`] from the shared fields.
macro_rules! write_options {
    ($($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        /// What both OpenAI routes read beside their own fields: sampling, stop, stream,
        /// limits and infgram's options.
        #[derive(Debug, Default)]
        pub struct Options {
            $($(#[$doc])* pub $field: $ty,)*
        }
    };
}

/// Writes a route's request struct: its own fields (given with their attributes), then the
/// shared ones, unknown fields refused; and `options`, which moves the shared ones out.
macro_rules! write_request {
    ($(#[$meta:meta])* $name:ident { $($own:tt)* }
     $($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        $(#[$meta])*
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($own)*
            $($(#[$doc])* #[serde(default)] pub $field: $ty,)*
        }

        impl $name {
            /// The fields both routes read, moved out (left at their defaults here).
            pub fn options(&mut self) -> Options {
                Options {
                    $($field: std::mem::take(&mut self.$field),)*
                }
            }
        }
    };
}

shared_fields!(write_options! {});

shared_fields!(write_request! {
    /// A `/v1/completions` request: OpenAI's fields and infgram's.
    CompletionRequest {
        /// The prompt: text (tokenized with the generator's tokenizer), or token ids.
        pub prompt: Prompt,
        /// SBIS levels (−1: all).
        #[serde(default)]
        pub k: Option<i64>,
    }
});

shared_fields!(write_request! {
    /// A `/v1/chat/completions` request: OpenAI's fields and infgram's.
    ChatRequest {
        /// The conversation.
        pub messages: Vec<ChatMessage>,
        /// `max_tokens` under OpenAI's newer name (this one wins when both are given).
        #[serde(default)]
        pub max_completion_tokens: Option<usize>,
        /// `{"include_usage": true}`: a last event with the usage.
        #[serde(default)]
        pub stream_options: Option<StreamOptions>,
        /// OpenAI penalties: 0 (or left out) only.
        #[serde(default)]
        pub frequency_penalty: Option<f64>,
        /// OpenAI penalties: 0 (or left out) only.
        #[serde(default)]
        pub presence_penalty: Option<f64>,
        /// Log-probabilities: not returned (`false` or left out only).
        #[serde(default)]
        pub logprobs: Option<bool>,
        /// Read control tokens' strings in the messages as control tokens (default: text).
        #[serde(default)]
        pub parse_special: bool,
    }
});

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// A last event with the usage (and no choices).
    #[serde(default)]
    pub include_usage: bool,
}

/// One message: its content a string, or OpenAI's list of text parts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (`developer` is read as `system`).
    pub role: String,
    /// The text.
    pub content: Content,
    /// A participant's name (ignored).
    #[serde(default)]
    pub name: Option<String>,
}

/// A message's content.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts: `{"type": "text", "text": …}` each.
    Parts(Vec<Value>),
}

/// What either route asks the generation worker for: a prompt (text, ids or a conversation)
/// and the options.
#[derive(Debug, Default)]
pub struct Completion {
    /// The prompt.
    pub prompt: Prompt,
    /// SBIS levels (−1: all; completions only).
    pub k: Option<i64>,
    /// The rest of the request.
    pub options: Options,
}

impl CompletionRequest {
    /// The completion this request asks for.
    pub fn completion(mut self) -> Completion {
        Completion {
            options: self.options(),
            prompt: self.prompt,
            k: self.k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_reads_the_shared_fields_and_refuses_others() {
        let shared = r#""temperature": 0, "top_k": 5, "stop": ["\n"], "stream": true,
            "mode": "neural", "guard": 8, "corpus_rule": "longest_suffix", "user": "u""#;
        let text: CompletionRequest =
            serde_json::from_str(&format!(r#"{{"prompt": "a", "k": 2, {shared}}}"#)).unwrap();
        let chat: ChatRequest = serde_json::from_str(&format!(
            r#"{{"messages": [{{"role": "user", "content": "a"}}], "logprobs": false, {shared}}}"#
        ))
        .unwrap();
        let text = text.completion();
        let mut chat = chat;
        let options = chat.options();
        for o in [&text.options, &options] {
            assert_eq!(o.temperature, Some(0.0));
            assert_eq!(o.top_k, Some(5));
            assert!(o.stream);
            assert_eq!(o.mode, Some(Mode::Neural));
            assert_eq!(o.guard, Some(8));
            assert_eq!(o.corpus_rule, CorpusRule::LongestSuffix);
        }
        assert_eq!(text.k, Some(2));
        assert_eq!(chat.messages.len(), 1);
        // A field of the other route, or of none, is refused with the fields this one reads.
        let e = serde_json::from_str::<ChatRequest>(r#"{"messages": [], "k": 2}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `k`"), "{e}");
        assert!(e.to_string().contains("corpus_rule"), "{e}");
        let e = serde_json::from_str::<CompletionRequest>(r#"{"prompt": "a", "logprobs": true}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `logprobs`"), "{e}");
        let e = serde_json::from_str::<CompletionRequest>(r#"{"prompt": "a", "tempreature": 1}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `tempreature`"), "{e}");
    }
}
