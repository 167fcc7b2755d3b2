#pragma once
// `tether cron run`: a host's cron scheduler on a database (cmd_cron_run.cpp).
#include "command.hpp"

namespace tether::cli {

int cron_run(const args& a);

}  // namespace tether::cli
