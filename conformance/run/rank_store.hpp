// The ranks' side of the harness's rendezvous store (NOTE [rank store] in
// conformance/launch/store.cpp), as the c10d::Store that Gloo's process groups are built on.
#pragma once
#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace gradcert {

/// A c10d::Store over a connection to the StoreServer at `address`; `timeout` bounds get and
/// wait (a peer that never arrives fails the rendezvous naming the keys). Throws
/// c10::DistStoreError naming the address when it cannot connect.
c10::intrusive_ptr<c10d::Store> connect_rank_store(const std::string& address, std::chrono::milliseconds timeout);

}  // namespace gradcert
