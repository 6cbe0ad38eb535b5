//! Assets.
