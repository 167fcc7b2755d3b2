#pragma once
// The one include of the embedding API: tether::embedded (open, sessions,
// prompts, steers, interrupts, typed transcripts and inboxes, waits,
// shutdown), agents as tether::agent or a callable taking a tether::turn, and
// the enums for roles, message kinds, task kinds and states, and job policies.
// README.md ("Embedding") walks through it; examples/embed/ is a whole host.
#include "tether/embed/embedded.hpp"
