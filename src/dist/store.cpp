// TcpStore (dist/store.h): rank 0 serves a key-value table over TCP; every rank is a client.
// Wire format, both directions: op (1 byte), key length (u32), key, value length (u32), value. Ops: 'S' set
// (reply: empty), 'G' get (the reply waits until the key is set), 'A' add (value: the decimal delta; reply:
// the decimal new value). One server thread per client connection: a job's ranks are few.
#include "hadatrain/dist/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "hadatrain/core/error.h"

namespace ht::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// Sends all of `n` bytes; false when the peer is gone.
bool send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

enum class RecvStatus { ok, closed, timed_out };

// Receives exactly `n` bytes before `deadline` (none: no limit).
RecvStatus recv_all(int fd, void* data, std::size_t n, std::optional<Clock::time_point> deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return RecvStatus::timed_out;
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return RecvStatus::timed_out;
    }
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return RecvStatus::closed;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return RecvStatus::ok;
}

bool send_message(int fd, char op, const std::string& key, const std::vector<char>& value) {
  const uint32_t kn = htonl(static_cast<uint32_t>(key.size()));
  const uint32_t vn = htonl(static_cast<uint32_t>(value.size()));
  return send_all(fd, &op, 1) && send_all(fd, &kn, 4) && send_all(fd, key.data(), key.size()) &&
         send_all(fd, &vn, 4) && send_all(fd, value.data(), value.size());
}

struct Message {
  char op = 0;
  std::string key;
  std::vector<char> value;
};

RecvStatus recv_message(int fd, Message& m, std::optional<Clock::time_point> deadline) {
  uint32_t n = 0;
  RecvStatus s = recv_all(fd, &m.op, 1, deadline);
  if (s == RecvStatus::ok) s = recv_all(fd, &n, 4, deadline);
  if (s != RecvStatus::ok) return s;
  m.key.resize(ntohl(n));
  s = recv_all(fd, m.key.data(), m.key.size(), deadline);
  if (s == RecvStatus::ok) s = recv_all(fd, &n, 4, deadline);
  if (s != RecvStatus::ok) return s;
  m.value.resize(ntohl(n));
  return recv_all(fd, m.value.data(), m.value.size(), deadline);
}

// True when the peer has closed its end (nothing to read and end of stream).
bool peer_closed(int fd) {
  char c = 0;
  const ssize_t k = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

struct TcpStore::Server {
  int listen_fd = -1;
  int port = 0;
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::vector<char>> table;
  bool stopping = false;
  std::vector<int> clients;
  int connected = 0;  // clients whose connection is open
  std::vector<std::thread> threads;
  std::thread acceptor;

  explicit Server(int requested_port) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    HT_CHECK(listen_fd >= 0, "dist store: cannot create a socket: {}", std::strerror(errno));
    int one = 1;
    ::setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(requested_port));
    if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd, 128) != 0) {
      const std::string why = std::strerror(errno);
      ::close(listen_fd);
      HT_FAIL("dist store: rank 0 cannot listen on port {} (MASTER_PORT): {}; choose a free port", requested_port,
              why);
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    acceptor = std::thread([this] { accept_loop(); });
  }

  // Note [Store shutdown]: rank 0 may finish before another rank has read its last reply (a rank that
  // throws on a mismatch all ranks detect, say); the server waits for the other ranks to close their
  // connections (they do when their store goes, or their process ends), at most kShutdownGrace, so their
  // last answers are delivered.
  static constexpr auto kShutdownGrace = std::chrono::seconds(5);
  ~Server() {
    {
      std::unique_lock lock(mu);
      changed.wait_for(lock, kShutdownGrace, [&] { return connected == 0; });
      stopping = true;
      for (int fd : clients) ::shutdown(fd, SHUT_RDWR);
    }
    changed.notify_all();
    ::shutdown(listen_fd, SHUT_RDWR);
    ::close(listen_fd);
    acceptor.join();
    for (auto& t : threads) t.join();
    for (int fd : clients) ::close(fd);
  }

  void accept_loop() {
    while (true) {
      const int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // the listening socket was shut down
      }
      set_nodelay(fd);
      std::lock_guard lock(mu);
      if (stopping) {
        ::close(fd);
        return;
      }
      clients.push_back(fd);
      ++connected;
      threads.emplace_back([this, fd] {
        serve(fd);
        std::lock_guard lock(mu);
        --connected;
        changed.notify_all();
      });
    }
  }

  void serve(int fd) {
    Message m;
    while (recv_message(fd, m, std::nullopt) == RecvStatus::ok) {
      std::vector<char> reply;
      std::unique_lock lock(mu);
      if (m.op == 'S') {
        table[m.key] = m.value;
        changed.notify_all();
      } else if (m.op == 'G') {
        // Waits for the key; a client that gave up (its own timeout) and closed ends the wait, so the
        // server's shutdown (Note [Store shutdown]) is not held up by a wait nobody reads.
        while (!stopping && table.count(m.key) == 0) {
          changed.wait_for(lock, std::chrono::milliseconds(50));
          if (peer_closed(fd)) return;
        }
        if (stopping) return;
        reply = table[m.key];
      } else if (m.op == 'A') {
        auto& v = table[m.key];
        const long long now = (v.empty() ? 0 : std::stoll(std::string(v.begin(), v.end()))) +
                              std::stoll(std::string(m.value.begin(), m.value.end()));
        const std::string s = std::to_string(now);
        v.assign(s.begin(), s.end());
        reply = v;
        changed.notify_all();
      } else {
        return;  // not a store client: drop the connection
      }
      lock.unlock();
      if (!send_message(fd, m.op, m.key, reply)) return;
    }
  }
};

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {
  if (options_.is_server) {
    server_ = std::make_unique<Server>(options_.port);
    options_.port = server_->port;
  }
  const std::string where = fmt::format("{}:{}", options_.host, options_.port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &found);
  HT_CHECK(gai == 0, "dist store: cannot resolve MASTER_ADDR '{}': {}", options_.host, ::gai_strerror(gai));
  const auto deadline = Clock::now() + options_.timeout;
  std::string last_error;
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0 && ::connect(fd_, found->ai_addr, found->ai_addrlen) == 0) break;
    last_error = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 may not be listening yet
  }
  ::freeaddrinfo(found);
  HT_CHECK(fd_ >= 0,
           "dist store: cannot reach rank 0's store at {} within {:g} s ({}); is rank 0 running, and are "
           "MASTER_ADDR and MASTER_PORT the same on every rank?",
           where, seconds(options_.timeout), last_error);
  set_nodelay(fd_);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);  // this rank's own connection first (Note [Store shutdown])
  server_.reset();
}

int TcpStore::port() const { return options_.port; }

std::vector<char> TcpStore::request(char op, const std::string& key, const std::vector<char>& value) {
  const std::string where = fmt::format("{}:{}", options_.host, options_.port);
  HT_CHECK(fd_ >= 0, "dist store: the connection to {} was closed by an earlier failure", where);
  const bool sent = send_message(fd_, op, key, value);
  Message reply;
  const RecvStatus s = sent ? recv_message(fd_, reply, Clock::now() + options_.timeout) : RecvStatus::closed;
  if (s == RecvStatus::ok) return reply.value;
  ::close(fd_);
  fd_ = -1;
  HT_CHECK(s != RecvStatus::timed_out,
           "dist store: key '{}' was not set by another rank within {:g} s (dist.timeout_s; {} ranks): a rank "
           "stopped before this point or is stalled",
           key, seconds(options_.timeout), options_.world_size);
  HT_FAIL("dist store: rank 0's store at {} closed the connection while waiting for '{}' (did rank 0 exit?)",
          where, key);
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) { request('S', key, value); }

std::vector<char> TcpStore::get(const std::string& key) { return request('G', key, {}); }

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string d = std::to_string(delta);
  const auto v = request('A', key, {d.begin(), d.end()});
  return std::stoll(std::string(v.begin(), v.end()));
}

}  // namespace ht::dist
