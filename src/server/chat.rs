//! `POST /v1/chat/completions`: OpenAI's chat API (`messages`, `max_tokens` or
//! `max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop`, `stream` as server-sent
//! events with `stream_options.include_usage`, `usage`) over the completions' one generation
//! path ([`super::completions`]): a chat request is a completion whose prompt is the
//! conversation ([`crate::service::request::Prompt::Chat`]), rendered by the model's chat
//! template with the messages' texts as text. A greedy request (`temperature` 0) with a model
//! decodes speculatively unless it says `"speculative": false`: the same tokens, sooner.

use super::api::ApiError;
use super::completions::{CompletionRequest, Mode, Summary};
use crate::service::chat::Message;
use crate::service::request::{CorpusRule, Prompt};
use serde::Deserialize;
use serde_json::{json, Value};

/// A chat request: OpenAI's fields and infgram's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The model's name (any value: the server has one model).
    #[serde(default)]
    pub model: Option<String>,
    /// Tokens to generate at most.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// The same, under OpenAI's newer name.
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    /// Sampling temperature (0: greedy).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass, in (0, 1].
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Random seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Text that ends the answer where it first appears (a string or up to 4).
    #[serde(default)]
    pub stop: Option<Value>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": true}`: a last event with the usage.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Answers per request: only 1.
    #[serde(default)]
    pub n: Option<usize>,
    /// OpenAI options that change nothing here.
    #[serde(default)]
    pub user: Option<String>,
    /// OpenAI penalties: 0 (or left out) only.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// OpenAI penalties: 0 (or left out) only.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Log-probabilities: not returned (`false` or left out only).
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// How to generate (default: `speculative` when greedy, else `neural`).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// The served index to draft, mix and guard with.
    #[serde(default)]
    pub index: Option<String>,
    /// The copy guard.
    #[serde(default)]
    pub guard: Option<usize>,
    /// Verify drafts (default: when greedy).
    #[serde(default)]
    pub speculative: Option<bool>,
    /// Also decode without drafts and report both speeds.
    #[serde(default)]
    pub compare: bool,
    /// How the index drafts.
    #[serde(default)]
    pub corpus_rule: CorpusRule,
    /// Read control tokens' strings in the messages as control tokens (default: text).
    #[serde(default)]
    pub parse_special: bool,
}

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

impl ChatMessage {
    fn message(&self) -> Result<Message, ApiError> {
        let content = match &self.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => Err(ApiError::bad(format!(
                        "a message part {p} is not text: this server reads text parts only"
                    ))),
                })
                .collect::<Result<Vec<&str>, _>>()?
                .concat(),
        };
        let role = match self.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant") => r,
            other => {
                return Err(ApiError::bad(format!(
                    "a message's role is system, user or assistant, not {other:?}"
                )))
            }
        };
        Ok(Message::new(role, &content))
    }
}

impl ChatRequest {
    /// The completion this chat asks for: its prompt the conversation, speculative by
    /// default when greedy and a model serves.
    pub fn completion(self, has_model: bool) -> Result<CompletionRequest, ApiError> {
        let trivial = |x: Option<f64>| x.is_none_or(|x| x == 0.0);
        if !trivial(self.frequency_penalty) || !trivial(self.presence_penalty) {
            return Err(ApiError::bad(
                "\"frequency_penalty\" and \"presence_penalty\" are not supported: leave them \
                 out or 0",
            ));
        }
        if self.logprobs == Some(true) {
            return Err(ApiError::bad(
                "\"logprobs\" are not returned by this server",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad("\"messages\" must hold at least one message"));
        }
        let messages = self
            .messages
            .iter()
            .map(ChatMessage::message)
            .collect::<Result<Vec<_>, _>>()?;
        let greedy = self.temperature == Some(0.0);
        let mode = match (self.mode, has_model) {
            (Some(m), _) => m,
            (None, false) => {
                return Err(ApiError::bad(
                    "chat completions need a model: start the server with --model",
                ))
            }
            (None, true) if greedy && self.speculative != Some(false) => Mode::Speculative,
            (None, true) => Mode::Neural,
        };
        if mode == Mode::Sbis {
            return Err(ApiError::bad(
                "chat completions are the model's: mode \"sbis\" continues text, at \
                 /v1/completions",
            ));
        }
        let speculative = match mode {
            Mode::Speculative => None,
            _ => self.speculative,
        };
        Ok(CompletionRequest {
            prompt: Prompt::Chat {
                messages,
                parse_special: self.parse_special,
            },
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: None,
            seed: self.seed,
            stream: self.stream,
            n: self.n,
            model: self.model,
            stop: self.stop,
            user: self.user,
            mode: Some(mode),
            index: self.index,
            guard: self.guard,
            k: None,
            speculative,
            compare: self.compare,
            corpus_rule: self.corpus_rule,
        })
    }
}

/// The OpenAI chat completion object.
pub fn chat_json(id: &str, created: u64, model: &str, text: &str, summary: &Summary) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": summary.finish_reason,
        }],
        "usage": usage(summary),
        "infgram": summary.infgram,
    })
}

/// One chunk of a streamed chat completion: the assistant's role first, then text, then the
/// end (`finish_reason`, an empty delta).
pub fn chat_chunk(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    finish_reason: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}

/// The last chunk of a stream that asked for its usage (`stream_options.include_usage`): no
/// choices, the usage and infgram's report.
pub fn usage_chunk(id: &str, created: u64, model: &str, summary: &Summary) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(summary),
        "infgram": summary.infgram,
    })
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    })
}
