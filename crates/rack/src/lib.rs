//! The rack: configuration, node runtimes, control channel and launcher.
