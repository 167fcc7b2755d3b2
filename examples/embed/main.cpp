// embed: an actor answers an ask, the persistence writer commits its answer,
// and a read connection finds it on disk. Exits 0 only if all three worked.
#include <SQLiteCpp/Statement.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <tether/persistence/database.hpp>
#include <tether/persistence/writer.hpp>
#include <tether/runtime/actor.hpp>
#include <tether/runtime/sync_wait.hpp>

namespace asio = boost::asio;
namespace rt = tether::runtime;
namespace db = tether::persistence;

struct greet {
  std::string who;
  rt::reply_to<std::string> reply;
};
using greeter_msg = std::variant<greet>;

class greeter : public rt::actor<greeter, greeter_msg> {
 public:
  using actor::actor;
  void handle(greeter_msg& m) {
    auto& g = std::get<greet>(m);
    g.reply.send("hello, " + g.who);
  }
};

asio::awaitable<int> run(std::shared_ptr<greeter> g, db::writer* w, std::string path) {
  greet q{"embedder", {}};
  auto hello = co_await g->ask(std::move(q), std::chrono::seconds(5));
  if (!hello) {
    std::fprintf(stderr, "embed: ask failed: %s\n", hello.error().message.c_str());
    co_return 1;
  }
  std::string text = *hello;

  auto save = [text](SQLite::Database& d) -> std::int64_t {
    d.exec("CREATE TABLE IF NOT EXISTS greetings(id INTEGER PRIMARY KEY, text TEXT NOT NULL)");
    SQLite::Statement ins(d, "INSERT INTO greetings(text) VALUES (?)");
    ins.bind(1, text);
    ins.exec();
    return d.getLastInsertRowid();
  };
  std::string name = "save greeting";
  auto id = co_await w->write(std::move(name), text.size(), std::move(save));
  if (!id) {
    std::fprintf(stderr, "embed: write failed: %s\n", id.error().message.c_str());
    co_return 1;
  }

  db::reader_pool readers(path);
  auto r = readers.acquire();
  SQLite::Statement sel(*r, "SELECT text FROM greetings WHERE id = ?");
  sel.bind(1, *id);
  if (!sel.executeStep() || sel.getColumn(0).getString() != text) {
    std::fprintf(stderr, "embed: row %lld is not on disk as written\n",
                 static_cast<long long>(*id));
    co_return 1;
  }
  std::printf("the actor said \"%s\"; committed as row %lld of %s\n", text.c_str(),
              static_cast<long long>(*id), path.c_str());
  co_await g->stop();
  co_return 0;
}

int main() {
  auto dir = std::filesystem::temp_directory_path() /
             ("tether-embed-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  int rc = 1;
  {
    db::db_options opts;
    opts.path = (dir / "embed.db").string();
    auto w = db::writer::open(opts);
    if (!w) {
      std::fprintf(stderr, "embed: cannot open the writer: %s\n", w.error().message.c_str());
    } else {
      asio::io_context io;
      auto g = std::make_shared<greeter>(io.get_executor(), rt::actor_options{"greeter"});
      rc = rt::run_to_completion(io, run(g, w->get(), opts.path));
      (*w)->stop();
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
