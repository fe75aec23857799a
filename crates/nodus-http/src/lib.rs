//! hyper 1.x on the nodus event loop (being written).
