// Removed once the first actor lands.
