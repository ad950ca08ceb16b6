// Store: the key-value table the ranks of a job share while they connect (Gloo's addresses, NCCL's unique
// id, each rank's config hash). TcpStore is the one implementation: rank 0 serves it on MASTER_ADDR:
// MASTER_PORT from a background thread; every rank (rank 0 too) is a client of that server. Values are bytes.
// get() waits for a key another rank has not set yet, at most the store's timeout (Note [Collective
// timeouts] in communicator.h), and then fails naming the key and the server, so a rank that died before
// the rendezvous stops the others with an error.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ht::dist {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // The value of `key`, waiting until some rank sets it (at most timeout()).
  virtual std::vector<char> get(const std::string& key) = 0;
  // Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  void set_string(const std::string& key, const std::string& value) { set(key, {value.begin(), value.end()}); }
  std::string get_string(const std::string& key) {
    const auto v = get(key);
    return {v.begin(), v.end()};
  }
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the server's address (MASTER_ADDR)
  int port = 29500;                // its port (MASTER_PORT)
  bool is_server = false;          // rank 0: listen on port before connecting
  int world_size = 1;              // for messages
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  int port() const;  // the port actually served (is_server with port 0 picks a free one)

 private:
  struct Server;
  std::vector<char> request(char op, const std::string& key, const std::vector<char>& value);

  TcpStoreOptions options_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;  // this client's connection to the server
};

}  // namespace ht::dist
