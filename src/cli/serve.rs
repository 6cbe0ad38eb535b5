//! `infgram serve`: the HTTP server of [`infgram::server`] with its limits as flags.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `infgram serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// An index to serve, as NAME=DIR (repeat for several; requests name it in "index").
    /// Default: Tiny Shakespeare's byte-level index as `shakespeare` (built on first use).
    #[arg(long = "index", value_name = "NAME=DIR", value_parser = name_and_dir)]
    pub indexes: Vec<(String, PathBuf)>,
    /// The tokenizer of index NAME, as NAME=TOKENIZER (a short model name, `bytes`, or a
    /// tokenizer file): for an index that does not record its own (infini-gram's u16 / u32
    /// indexes), so that text queries work. Repeat for several. A FILE alone (no `=`): the
    /// --model's tokenizer.json, in place of the tokenizer its GGUF file carries.
    #[arg(long = "tokenizer", value_name = "NAME=TOKENIZER|FILE", value_parser = name_and_tokenizer)]
    pub tokenizers: Vec<(String, String)>,
    /// A neural model for /v1/completions (as `gen --model` takes it), loaded once at start.
    #[arg(long)]
    pub model: Option<String>,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: std::net::SocketAddr,
    /// Do not log one line per request on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 64 * 1024, value_parser = super::positive)]
    pub max_body: usize,
    /// Longest query string, in characters.
    #[arg(long, default_value_t = 1000, value_parser = super::positive)]
    pub max_query_chars: usize,
    /// Longest query, in tokens.
    #[arg(long, default_value_t = 500, value_parser = super::positive)]
    pub max_query_tokens: usize,
    /// Most documents a search_docs or attribute query returns (`maxnum`).
    #[arg(long, default_value_t = 10)]
    pub max_maxnum: usize,
    /// Longest document window, in tokens (`max_disp_len`).
    #[arg(long, default_value_t = 10_000)]
    pub max_disp_len: usize,
    /// Longest completion, in tokens (`max_tokens`).
    #[arg(long, default_value_t = 2048, value_parser = super::positive)]
    pub max_tokens: usize,
    /// Longest completion prompt, in tokens.
    #[arg(long, default_value_t = 4096, value_parser = super::positive)]
    pub max_prompt_tokens: usize,
    /// Seconds a query may take before it is answered 408.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub query_timeout: f64,
    /// Seconds a generation may run (it ends there with what it has).
    #[arg(long, default_value_t = 120.0, value_parser = seconds)]
    pub generation_timeout: f64,
    /// Seconds a client has to send a request's headers, and again its body.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub client_timeout: f64,
    /// Generations that may wait for a worker (more are answered 429).
    #[arg(long, default_value_t = 8)]
    pub backlog: usize,
    /// Generations run at once: their new tokens share the model's passes (the native CPU
    /// backend; a backend of one sequence serves one at a time), each answer the same as
    /// the request's alone. 1: one at a time. Default: as many rows as the model's passes
    /// still pay for on this machine (of 1, 2, 4, 8 and 16, the fewest that give 90% of the
    /// best tokens/s, from the measured pass costs), at most as many of the longest
    /// requests (--max-prompt-tokens plus --max-tokens) as --kv-cache-mib holds; 4 without
    /// a model. The server says the number when it starts, and /health shows it.
    #[arg(long, value_parser = super::positive)]
    pub parallel: Option<usize>,
    /// MiB of KV cache the running generations may hold together (on the native backend,
    /// whose generations share one model's passes): a generation waits while the others leave too little for what its
    /// prompt and max_tokens may need, and one that could never fit is answered 413.
    #[arg(long, default_value_t = 4096, value_parser = super::positive_mib)]
    pub kv_cache_mib: usize,
    /// MiB of KV cache kept of ended generations (on the native backend, at any --parallel):
    /// a request whose prompt starts with a kept generation's tokens (a chat's
    /// next turn, a shared system prompt) reads only the rest, with the same answer. The
    /// oldest go past the bound; 0: none kept. /metrics counts the tokens not read again.
    #[arg(long, default_value_t = 256, value_parser = super::mib)]
    pub prompt_cache_mib: usize,
    /// Queries that run at once (more wait their turn).
    #[arg(long, default_value_t = 64, value_parser = super::positive)]
    pub concurrent_queries: usize,
    /// Bytes the drafting sessions of `POST /v1/drafts` (with a `request_id`) may hold, all
    /// indexes together: a session costs about 30 bytes a token of its context; past the
    /// bound (or 4,096 sessions) the least recently used end, counted in `/metrics`
    /// (`infgram_draft_sessions_dropped_total`). Default 256 MiB.
    #[arg(long, default_value_t = infgram::service::drafts::DEFAULT_SESSION_BYTES, value_parser = super::positive)]
    pub draft_session_bytes: usize,
    /// With --model: tokens of past outputs kept for speculative completions to draft from
    /// (the oldest go; 0: none kept).
    #[arg(long, default_value_t = 1 << 18)]
    pub past_output_tokens: usize,
    /// With --model: keep the past outputs in FILE across restarts (read at start, written
    /// after every completion; a file written with another tokenizer is refused and kept).
    #[arg(long, value_name = "FILE")]
    pub past_outputs: Option<PathBuf>,
    /// How `POST /v1/drafts` drafts from an index: the SBIS argmax, or the longest matching
    /// suffix's most frequent continuation (cheaper; better on a large corpus). A completion
    /// names its own (`corpus_rule`).
    #[arg(long, value_enum, default_value = "sbis")]
    pub corpus_rule: infgram::service::request::CorpusRule,
    /// A host name the server answers to (the `Host` of requests, the `Origin` of web pages)
    /// beside IP addresses and `localhost`: requests naming any other are refused, so that a
    /// web page cannot reach the server through a name it controls. Repeat for several.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

/// Parses `NAME=DIR`.
fn name_and_dir(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!(
            "`{s}` is not NAME=DIR (e.g. --index shakespeare=./shakespeare.idx)"
        )),
    }
}

/// Parses `NAME=TOKENIZER`, or a FILE alone (the model's: an empty name).
fn name_and_tokenizer(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, tok)) if !name.is_empty() && !tok.is_empty() => {
            Ok((name.to_string(), tok.to_string()))
        }
        None if !s.is_empty() => Ok((String::new(), s.to_string())),
        _ => Err(format!(
            "`{s}` is not NAME=TOKENIZER (e.g. --tokenizer pile=llama-2.json)"
        )),
    }
}

/// Seconds: finite, above 0, at most a day.
fn seconds(s: &str) -> Result<f64, String> {
    super::number_in(s, (0.0, true), (86_400.0, false))
}

/// Runs `infgram serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<()> {
    args.model_args
        .refuse_without_model(args.model.as_deref())?;
    if let Some(file) = &args.past_outputs {
        if args.model.is_none() || args.past_output_tokens == 0 {
            anyhow::bail!(
                "--past-outputs {} keeps a model's past outputs: give --model, and a \
                 --past-output-tokens above 0",
                file.display()
            );
        }
    }
    // The model's own tokenizer file, given as --tokenizer FILE (no NAME=).
    let model_tokenizer = args
        .tokenizers
        .iter()
        .find(|(name, _)| name.is_empty())
        .map(|(_, file)| PathBuf::from(file));
    if model_tokenizer.is_some() && args.model.is_none() {
        anyhow::bail!(
            "--tokenizer FILE (without NAME=) is the --model's tokenizer: name a model, or give \
             an index's tokenizer as NAME=TOKENIZER"
        );
    }
    let model_options = infgram::service::models::ModelOptions {
        tokenizer: model_tokenizer,
        ..args.model_args.options()
    };
    // A device this build or machine lacks is refused before the default index is built.
    #[cfg(feature = "neural")]
    if args.model.is_some() {
        infgram::service::models::check_device(&model_options)?;
    }
    let indexes = if args.indexes.is_empty() {
        vec![(
            "shakespeare".to_string(),
            infgram::service::cached_byte_index(&[])?,
        )]
    } else {
        args.indexes.clone()
    };
    let limits = infgram::server::Limits {
        body_bytes: args.max_body,
        query: infgram::service::QueryLimits {
            text_chars: args.max_query_chars,
            tokens: args.max_query_tokens,
            maxnum: args.max_maxnum,
            max_disp_len: args.max_disp_len,
            ..infgram::server::Limits::default().query
        },
        max_tokens: args.max_tokens,
        prompt_tokens: args.max_prompt_tokens,
        query_time: std::time::Duration::from_secs_f64(args.query_timeout),
        generation_time: std::time::Duration::from_secs_f64(args.generation_timeout),
        client_time: std::time::Duration::from_secs_f64(args.client_timeout),
        backlog: args.backlog,
        parallel: args.parallel.unwrap_or(0),
        kv_cache_bytes: args.kv_cache_mib << 20,
        prompt_cache_bytes: args.prompt_cache_mib << 20,
        concurrent_queries: args.concurrent_queries,
        past_output_tokens: args.past_output_tokens,
        draft_session_bytes: args.draft_session_bytes,
        ..Default::default()
    };
    let names: Vec<String> = indexes.iter().map(|(n, _)| n.clone()).collect();
    let config = infgram::server::ServerConfig {
        addr: args.addr,
        indexes,
        tokenizers: args
            .tokenizers
            .iter()
            .filter(|(name, _)| !name.is_empty())
            .cloned()
            .collect(),
        model: args.model.clone(),
        model_options: model_options.clone(),
        limits,
        log_requests: !args.quiet,
        past_outputs_file: args.past_outputs.clone(),
        corpus_rule: args.corpus_rule,
        allowed_hosts: args.allow_hosts.clone(),
    };
    infgram::server::serve(config, |server| {
        infgram::diag!(
            "listening on http://{} (indexes: {}; model: {}; {} generations at once); Ctrl-C \
             stops",
            server.local_addr(),
            names.join(", "),
            server.model_name().unwrap_or("none, sbis only"),
            server.parallel()
        );
    })?;
    infgram::diag!("stopped");
    Ok(())
}
