//! The pass costs speculative decoding plans with, measured once per machine and model and
//! kept in the cache (SmolLM2, fetched on first use).
#![cfg(feature = "neural")]

use infgram::decode::policy::CALIBRATED_SIZES;
use infgram::service::models::{load_model, ModelOptions};

#[test]
fn pass_costs_are_measured_once_and_kept() {
    let cache = tempfile::tempdir().unwrap();
    // The models stay where they are; the calibration goes into a cache of this test's own.
    std::env::set_var("INFGRAM_MODELS", infgram::assets::models_dir());
    std::env::set_var("INFGRAM_CACHE", cache.path());
    let opts = ModelOptions {
        threads: 1,
        ..Default::default()
    };
    let mut loaded = load_model("smollm2-135m", &opts).unwrap();
    let costs = loaded.pass_costs();
    let dir = cache.path().join("calibration");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(
        files.len(),
        1,
        "one file for this model, machine and options"
    );
    let path = files[0].as_ref().unwrap().path();
    let points: Vec<(usize, f64)> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        points.iter().map(|p| p.0).collect::<Vec<_>>(),
        CALIBRATED_SIZES.to_vec()
    );
    assert!(points.iter().all(|p| p.1 > 0.0), "{points:?}");
    for &(n, _) in &points[1..] {
        assert!(costs.cost(n) >= 1.0, "a pass costs a step at least: {n}");
    }
    // The model still generates from an empty cache after it.
    assert_eq!(loaded.model.cache_len(), 0);
    // Another load reads the file (a planted table shows through).
    std::fs::write(&path, "[[1,1.0],[2,1.0],[4,1.0],[8,1.0],[16,1.0]]").unwrap();
    let mut again = load_model("smollm2-135m", &opts).unwrap();
    assert_eq!(again.pass_costs().cost(16), 1.0);
    // A damaged file is measured again and replaced.
    std::fs::write(&path, "not json").unwrap();
    let mut third = load_model("smollm2-135m", &opts).unwrap();
    third.pass_costs();
    let points: Vec<(usize, f64)> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(points.len(), CALIBRATED_SIZES.len());
}
